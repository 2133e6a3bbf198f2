// lib/pq through database/sql: parameters are sent untyped; a float64 as
// its text.  The driver sets extra_float_digits = 2 at connect.
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
