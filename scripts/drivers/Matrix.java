// PgJDBC: setString is varchar, setBigDecimal numeric (a typed call); the
// driver sets extra_float_digits = 3 at connect.  For idem_call a text[]
// from createArrayOf, the ttl as a PGInterval through setObject (interval:
// setString would send varchar, and ttl => varchar does not resolve, 42883)
// and setBoolean
import java.math.BigDecimal;
import java.sql.*;
import org.postgresql.util.PGInterval;

public class Matrix {
    static final String SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount";
    static final String CALL = "SELECT replayed, response::text FROM idem_execute_ex(?, ?, ?, ?)";

    static final String IDEM_CALL = "SELECT replayed, response::text FROM idem_call(?, ?, ?, "
        + "outbox_topic => ?, ttl => ?, wait => ?)";

    static ResultSet idemCall(Connection c, String key, boolean wait) throws SQLException {
        PreparedStatement ps = c.prepareStatement(IDEM_CALL);
        ps.setString(1, key);
        ps.setString(2, SQL);
        ps.setArray(3, c.createArrayOf("text", new String[] { key, "25.00" }));
        ps.setString(4, "matrix");
        ps.setObject(5, new PGInterval(0, 0, 2, 3, 0, 0));
        ps.setBoolean(6, wait);
        ResultSet rs = ps.executeQuery();
        rs.next();
        return rs;
    }

    static ResultSet call(Connection c, String key, String amount) throws SQLException {
        PreparedStatement ps = c.prepareStatement(CALL);
        ps.setString(1, key);
        ps.setString(2, SQL);
        ps.setString(3, key);
        ps.setBigDecimal(4, new BigDecimal(amount));
        ResultSet rs = ps.executeQuery();
        rs.next();
        return rs;
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT") + "/"
            + System.getenv("PGDATABASE") + "?user=" + System.getenv("PGUSER")
            + ("1".equals(System.getenv("VIA_BOUNCER")) ? "&prepareThreshold=0" : "");
        try (Connection c = DriverManager.getConnection(url)) {
            for (int i = 1; i < args.length; i++) {
                String key = args[i];
                if (args[0].equals("call")) {
                    for (int n = 0; n < 2; n++) {
                        ResultSet rs = idemCall(c, key, true);
                        System.out.println("call\t" + key + "\t" + rs.getBoolean(1) + "\t" + rs.getString(2));
                    }
                    continue;
                }
                if (args[0].equals("busy")) {
                    try {
                        idemCall(c, key, false);
                        System.out.println("busy\t" + key + "\tnone");
                    } catch (SQLException e) {
                        System.out.println("busy\t" + key + "\t" + e.getSQLState());
                    }
                    continue;
                }
                ResultSet rs = call(c, key, "25.00");
                System.out.println("result\t" + key + "\t" + rs.getBoolean(1) + "\t" + rs.getString(2));
                if (args[0].equals("retry")) {
                    try {
                        call(c, key, "26.00");
                        System.out.println("mismatch\t" + key + "\tnone");
                    } catch (SQLException e) {
                        System.out.println("mismatch\t" + key + "\t" + e.getSQLState());
                    }
                }
            }
        }
    }
}
