# ruby-pg: exec_params sends parameters untyped, each as its to_s; a
# BigDecimal as "0.25e2"
require 'pg'
require 'bigdecimal'

SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount'
CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)'
conn = PG.connect
mode, *keys = ARGV
$stdout.sync = true
keys.each do |key|
  r = conn.exec_params(CALL, [key, SQL, key, BigDecimal('25.00')])[0]
  puts "result\t#{key}\t#{r['replayed'] == 't'}\t#{r['response']}"
  next unless mode == 'retry'
  begin
    conn.exec_params(CALL, [key, SQL, key, BigDecimal('26.00')])
    puts "mismatch\t#{key}\tnone"
  rescue PG::Error => e
    puts "mismatch\t#{key}\t#{e.result.error_field(PG::PG_DIAG_SQLSTATE)}"
  end
end
