package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// chargeRequest is a request body that passed validation: what a charge
// is made of. Currency is upper case.
type chargeRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

// charge is a charge as it is stored and answered.
type charge struct {
	ID       string    `json:"id"`
	Amount   int64     `json:"amount"`
	Currency string    `json:"currency"`
	Customer string    `json:"customer"`
	Created  time.Time `json:"created"`
}

// fieldError names one field of a request body and what is wrong with it.
type fieldError struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// maxAmount is the largest amount taken: 2^53-1, the largest integer a
// JSON number carries exactly to every client (a JavaScript one too).
const maxAmount = 1<<53 - 1

// maxCustomer bounds a customer reference, in bytes.
const maxCustomer = 255

// exampleBody is what a valid body looks like, for error messages.
const exampleBody = `{"amount":1250,"currency":"EUR","customer":"cus_ada"}`

// parseCharge reads a request body. A body that is not one JSON object
// is an error (400); a JSON object whose fields are wrong returns every
// fault it has as fieldErrors (422), so a client fixes them in one go.
func parseCharge(body []byte) (chargeRequest, []fieldError, error) {
	var req chargeRequest
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		why := "it is empty"
		if err != nil && len(bytes.TrimSpace(body)) > 0 {
			why = err.Error()
		} else if err == nil {
			why = "it is null"
		}
		return req, nil, fmt.Errorf("the body is not a JSON object (%s); send one such as %s", why, exampleBody)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, nil, fmt.Errorf("the body has more after its JSON object; send one object, such as %s", exampleBody)
	}

	var errs []fieldError
	fault := func(field, format string, args ...any) {
		errs = append(errs, fieldError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}
	if v, ok := raw["amount"]; !ok {
		fault("amount", "is required: a positive whole number of minor units (1250 for 12.50)")
	} else if n, err := strconv.ParseInt(string(v), 10, 64); err != nil {
		if v[0] == '"' {
			fault("amount", "is a string; send a JSON number, a whole number of minor units (1250 for 12.50)")
		} else {
			fault("amount", "must be a whole number of minor units (1250 for 12.50), not %s", v)
		}
	} else if n <= 0 {
		fault("amount", "must be positive, not %d", n)
	} else if n > maxAmount {
		fault("amount", "must be at most %d", int64(maxAmount))
	} else {
		req.Amount = n
	}

	if v, ok := raw["currency"]; !ok {
		fault("currency", "is required: a three-letter ISO 4217 code such as EUR")
	} else if err := json.Unmarshal(v, &req.Currency); err != nil {
		fault("currency", "must be a string: a three-letter ISO 4217 code such as EUR")
	} else if !isCurrency(req.Currency) {
		fault("currency", "must be three letters (an ISO 4217 code such as EUR), not %q", req.Currency)
	} else {
		req.Currency = strings.ToUpper(req.Currency)
	}

	if v, ok := raw["customer"]; !ok {
		fault("customer", "is required: the reference of the customer to charge")
	} else if err := json.Unmarshal(v, &req.Customer); err != nil {
		fault("customer", "must be a string: the reference of the customer to charge")
	} else if strings.TrimSpace(req.Customer) == "" {
		fault("customer", "must not be empty; send the reference of the customer to charge")
	} else if len(req.Customer) > maxCustomer {
		fault("customer", "is %d bytes; a customer reference is at most %d", len(req.Customer), maxCustomer)
	} else if strings.IndexFunc(req.Customer, unicode.IsControl) >= 0 || !utf8.ValidString(req.Customer) {
		fault("customer", "holds a control character or invalid UTF-8; send one line of text")
	}

	var unknown []string
	for name := range raw {
		if name != "amount" && name != "currency" && name != "customer" {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		fault(name, "is not a field of a charge; send amount, currency and customer only")
	}
	if errs != nil {
		return chargeRequest{}, errs, nil
	}
	return req, nil, nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20 // lower case
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// errKeyReused is the answer when a charge already exists under the key
// for another amount, currency or customer. The idempotency layer refuses
// such a repeat as long as it keeps the first request's record; this is
// the charges table's own word, for a key reused after that record was
// purged.
var errKeyReused = errors.New("this Idempotency-Key already created a charge with another amount, currency or customer; use a new key for a new charge")

// chargeTable is the application's table of charges, in the same
// database as once's action log. A charge is unique per tenant and
// Idempotency-Key: writing it again under the same key finds the first
// one instead of making a second, which is what makes the charge safe to
// run again after a crash (see create).
type chargeTable struct {
	db *sql.DB
	// name is the table's name, quoted and, in PostgreSQL, qualified by
	// its schema.
	name string
	// param renders the n-th statement parameter (from 1): ? for SQLite,
	// $n for PostgreSQL.
	param func(n int) string
}

// newSQLiteCharges is the table in a SQLite file.
func newSQLiteCharges(db *sql.DB) *chargeTable {
	return &chargeTable{db: db, name: `"payments_charges"`, param: func(int) string { return "?" }}
}

// newPostgresCharges is the table in PostgreSQL's schema, the one that
// holds once's tables.
func newPostgresCharges(db *sql.DB, schema string) *chargeTable {
	q := func(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
	return &chargeTable{db: db, name: q(schema) + `."payments_charges"`, param: func(n int) string { return "$" + strconv.Itoa(n) }}
}

// migrate makes the table if it does not exist. In PostgreSQL two
// processes starting at once could both try; an advisory lock orders
// them.
func (t *chargeTable) migrate(ctx context.Context, postgres bool) error {
	ddl := `CREATE TABLE IF NOT EXISTS ` + t.name + ` (
		id TEXT PRIMARY KEY,
		tenant TEXT NOT NULL,
		idempotency_key TEXT NOT NULL,
		amount BIGINT NOT NULL CHECK (amount > 0),
		currency TEXT NOT NULL,
		customer TEXT NOT NULL,
		created_ms BIGINT NOT NULL,
		UNIQUE (tenant, idempotency_key))`
	tx, err := t.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if postgres {
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext('payments_charges'))`); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, ddl); err != nil {
		return err
	}
	return tx.Commit()
}

const chargeColumns = `id, amount, currency, customer, created_ms`

// create writes the charge for tenant and key and returns it. If the key
// already has a charge (an earlier attempt wrote it, and its process
// died before the answer was recorded), that charge is returned with
// found set: the insert does nothing, and the same charge is answered
// again. A charge under the key with other details is errKeyReused.
//
// An insert that fails may have committed all the same (its reply was
// lost, or the request was cancelled while it ran), so the key's charge
// is read back before the failure is believed: a charge that exists is
// answered, never reported unwritten.
func (t *chargeTable) create(ctx context.Context, tenant, key string, req chargeRequest) (c charge, found bool, err error) {
	var id [12]byte
	rand.Read(id[:])
	p := t.param
	res, insertErr := t.db.ExecContext(ctx, `INSERT INTO `+t.name+` (id, tenant, idempotency_key, amount, currency, customer, created_ms)
		VALUES (`+p(1)+`, `+p(2)+`, `+p(3)+`, `+p(4)+`, `+p(5)+`, `+p(6)+`, `+p(7)+`)
		ON CONFLICT (tenant, idempotency_key) DO NOTHING`,
		"ch_"+hex.EncodeToString(id[:]), tenant, key, req.Amount, req.Currency, req.Customer, time.Now().UnixMilli())
	// Without the insert's word, the charge found may be this attempt's
	// own; it is reported found either way, which only the log tells.
	found = true
	if insertErr == nil {
		n, err := res.RowsAffected()
		if err != nil {
			return charge{}, false, err
		}
		found = n == 0
	}
	// On a context of its own: the request's may be what cut the insert
	// off, and what it left behind must still be read.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	c, err = scanCharge(t.db.QueryRowContext(rctx, `SELECT `+chargeColumns+` FROM `+t.name+` WHERE tenant = `+p(1)+` AND idempotency_key = `+p(2), tenant, key))
	switch {
	case err != nil && insertErr != nil:
		return charge{}, false, insertErr
	case err != nil:
		return charge{}, false, err
	}
	if c.Amount != req.Amount || c.Currency != req.Currency || c.Customer != req.Customer {
		return charge{}, true, errKeyReused
	}
	return c, found, nil
}

// list returns the tenant's charges, oldest first.
func (t *chargeTable) list(ctx context.Context, tenant string) ([]charge, error) {
	rows, err := t.db.QueryContext(ctx, `SELECT `+chargeColumns+` FROM `+t.name+` WHERE tenant = `+t.param(1)+` ORDER BY created_ms, id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	charges := []charge{}
	for rows.Next() {
		c, err := scanCharge(rows)
		if err != nil {
			return nil, err
		}
		charges = append(charges, c)
	}
	return charges, rows.Err()
}

// get returns one of the tenant's charges; sql.ErrNoRows if it has none
// with that id.
func (t *chargeTable) get(ctx context.Context, tenant, id string) (charge, error) {
	return scanCharge(t.db.QueryRowContext(ctx, `SELECT `+chargeColumns+` FROM `+t.name+` WHERE tenant = `+t.param(1)+` AND id = `+t.param(2), tenant, id))
}

func scanCharge(row interface{ Scan(...any) error }) (charge, error) {
	var c charge
	var ms int64
	if err := row.Scan(&c.ID, &c.Amount, &c.Currency, &c.Customer, &ms); err != nil {
		return charge{}, err
	}
	c.Created = time.UnixMilli(ms).UTC()
	return c, nil
}
