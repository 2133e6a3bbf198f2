// lib/pq through database/sql: parameters are sent untyped; a float64 as
// its text.  The driver sets extra_float_digits = 2 at connect.  For
// idem_call a pq.Array of []string, the ttl as a string (lib/pq has no
// interval type: a time.Duration is sent as its nanoseconds, 22015) and a
// Go bool
package main

import (
	"database/sql"
	"errors"
	"fmt"
	"os"

	"github.com/lib/pq"
)

const sqlText = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
const call = "SELECT replayed, response::text FROM idem_execute_ex($1, $2, $3, $4)"
const idemCall = "SELECT replayed, response::text FROM idem_call($1, $2, $3, " +
	"outbox_topic => $4, ttl => $5, wait => $6)"

func main() {
	dsn := "sslmode=disable"
	if os.Getenv("VIA_BOUNCER") == "1" {
		dsn += " binary_parameters=yes"
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	mode, keys := os.Args[1], os.Args[2:]
	for _, key := range keys {
		var replayed bool
		var response string
		idem := func(wait bool) error {
			return db.QueryRow(idemCall, key, sqlText, pq.Array([]string{key, "25.00"}), "matrix",
				"2 days 3 hours", wait).Scan(&replayed, &response)
		}
		if mode == "call" {
			for i := 0; i < 2; i++ {
				if err := idem(true); err != nil {
					panic(err)
				}
				fmt.Printf("call\t%s\t%v\t%s\n", key, replayed, response)
			}
			continue
		}
		if mode == "busy" {
			var pqErr *pq.Error
			if err := idem(false); errors.As(err, &pqErr) {
				fmt.Printf("busy\t%s\t%s\n", key, pqErr.Code)
			} else {
				fmt.Printf("busy\t%s\tnone\n", key)
			}
			continue
		}
		if err := db.QueryRow(call, key, sqlText, key, 25.0).Scan(&replayed, &response); err != nil {
			panic(err)
		}
		fmt.Printf("result\t%s\t%v\t%s\n", key, replayed, response)
		if mode != "retry" {
			continue
		}
		err := db.QueryRow(call, key, sqlText, key, 26.0).Scan(&replayed, &response)
		var pqErr *pq.Error
		if errors.As(err, &pqErr) {
			fmt.Printf("mismatch\t%s\t%s\n", key, pqErr.Code)
		} else {
			fmt.Printf("mismatch\t%s\tnone\n", key)
		}
	}
}
