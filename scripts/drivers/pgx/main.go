// pgx v4: it prepares each statement and encodes the arguments as the
// types the server describes; the amount is a Go string.  For idem_call a
// []string, a time.Duration (interval, also with PreferSimpleProtocol) and
// a Go bool
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

const sqlText = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
const call = "SELECT replayed, response::text FROM idem_execute_ex($1, $2, $3, $4)"
const idemCall = "SELECT replayed, response::text FROM idem_call($1, $2, $3, " +
	"outbox_topic => $4, ttl => $5, wait => $6)"

func main() {
	ctx := context.Background()
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		panic(err)
	}
	if os.Getenv("VIA_BOUNCER") == "1" {
		cfg.PreferSimpleProtocol = true
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer conn.Close(ctx)
	mode, keys := os.Args[1], os.Args[2:]
	for _, key := range keys {
		var replayed bool
		var response string
		idem := func(wait bool) error {
			return conn.QueryRow(ctx, idemCall, key, sqlText, []string{key, "25.00"}, "matrix", 51*time.Hour, wait).
				Scan(&replayed, &response)
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
			var pgErr *pgconn.PgError
			if err := idem(false); errors.As(err, &pgErr) {
				fmt.Printf("busy\t%s\t%s\n", key, pgErr.Code)
			} else {
				fmt.Printf("busy\t%s\tnone\n", key)
			}
			continue
		}
		if err := conn.QueryRow(ctx, call, key, sqlText, key, "25").Scan(&replayed, &response); err != nil {
			panic(err)
		}
		fmt.Printf("result\t%s\t%v\t%s\n", key, replayed, response)
		if mode != "retry" {
			continue
		}
		err := conn.QueryRow(ctx, call, key, sqlText, key, "26").Scan(&replayed, &response)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			fmt.Printf("mismatch\t%s\t%s\n", key, pgErr.Code)
		} else {
			fmt.Printf("mismatch\t%s\tnone\n", key)
		}
	}
}
