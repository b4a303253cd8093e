// Package rabbitmqtest finds the RabbitMQ broker the tests talk to. It
// lives in the brokertest module, so that amqp091-go stays out of the
// core module's graph.
package rabbitmqtest

import (
	"cmp"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/oncehq/once/internal/testdb"
)

// DefaultURL is the machine's RabbitMQ, as the README describes.
const DefaultURL = "amqp://guest:guest@127.0.0.1:5672/"

// URL returns ONCE_TEST_RABBITMQ_URL, or the default.
func URL() string {
	return cmp.Or(os.Getenv("ONCE_TEST_RABBITMQ_URL"), DefaultURL)
}

var (
	rmqOnce sync.Once
	rmqErr  error
)

// Reachable reports whether RabbitMQ answers at URL, and
// why not. It dials once per process; an Example cannot skip, so a
// package's TestMain asks this before it lets the examples run.
func Reachable() error {
	rmqOnce.Do(func() {
		conn, err := amqp.DialConfig(URL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			rmqErr = err
			return
		}
		rmqErr = conn.Close()
	})
	return rmqErr
}

// Require skips (or, under CI, fails) the test when RabbitMQ
// cannot be reached, and returns its URL.
func Require(t testing.TB) string {
	t.Helper()
	if err := Reachable(); err != nil {
		msg := "RabbitMQ is not reachable at " + URL() + " (" + err.Error() + "); start it with " +
			"'rabbitmq-server -detached' or set ONCE_TEST_RABBITMQ_URL"
		testdb.Unavailable(t, msg)
	}
	return URL()
}

// Dial opens a connection to the test broker (skipping the test
// as Require does when there is none), closed when the test
// ends. A test that means to break a connection opens its own.
func Dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(Require(t))
	if err != nil {
		t.Fatalf("dialling RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
