# ruby-pg: exec_params sends parameters untyped, each as its to_s; a
# BigDecimal as "0.25e2".  For idem_call an Array encoded by
# PG::TextEncoder::Array, the ttl as a string (no interval type) and a Ruby
# boolean ("true"/"false")
require 'pg'
require 'bigdecimal'

SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount'
CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)'
IDEM_CALL = 'SELECT replayed, response::text AS response FROM idem_call($1, $2, $3, ' \
            'outbox_topic => $4, ttl => $5, wait => $6)'
conn = PG.connect
TEXT_ARRAY = PG::TextEncoder::Array.new
def idem_call(conn, key, wait)
  conn.exec_params(IDEM_CALL, [key, SQL, TEXT_ARRAY.encode([key, '25.00']), 'matrix', '2 days 3 hours', wait])[0]
end
mode, *keys = ARGV
$stdout.sync = true
keys.each do |key|
  if mode == 'call'
    2.times do
      r = idem_call(conn, key, true)
      puts "call\t#{key}\t#{r['replayed'] == 't'}\t#{r['response']}"
    end
    next
  end
  if mode == 'busy'
    begin
      idem_call(conn, key, false)
      puts "busy\t#{key}\tnone"
    rescue PG::Error => e
      puts "busy\t#{key}\t#{e.result.error_field(PG::PG_DIAG_SQLSTATE)}"
    end
    next
  end
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
