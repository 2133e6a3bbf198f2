// PgJDBC: setString is varchar, setBigDecimal numeric (a typed call); the
// driver sets extra_float_digits = 3 at connect
import java.math.BigDecimal;
import java.sql.*;

public class Matrix {
    static final String SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount";
    static final String CALL = "SELECT replayed, response::text FROM idem_execute_ex(?, ?, ?, ?)";

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
