package testdb

import (
	"cmp"
	"os"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultRabbitMQURL is the machine's RabbitMQ, as the README describes.
const DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"

// RabbitMQURL returns ONCE_TEST_RABBITMQ_URL, or the default.
func RabbitMQURL() string {
	return cmp.Or(os.Getenv("ONCE_TEST_RABBITMQ_URL"), DefaultRabbitMQURL)
}

var (
	rmqOnce sync.Once
	rmqErr  error
)

// RabbitMQReachable reports whether RabbitMQ answers at RabbitMQURL, and
// why not. It dials once per process; an Example cannot skip, so a
// package's TestMain asks this before it lets the examples run.
func RabbitMQReachable() error {
	rmqOnce.Do(func() {
		conn, err := amqp.DialConfig(RabbitMQURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err != nil {
			rmqErr = err
			return
		}
		rmqErr = conn.Close()
	})
	return rmqErr
}

// RequireRabbitMQ skips (or, under CI, fails) the test when RabbitMQ
// cannot be reached, and returns its URL.
func RequireRabbitMQ(t testing.TB) string {
	t.Helper()
	if err := RabbitMQReachable(); err != nil {
		msg := "RabbitMQ is not reachable at " + RabbitMQURL() + " (" + err.Error() + "); start it with " +
			"'rabbitmq-server -detached' or set ONCE_TEST_RABBITMQ_URL"
		Unavailable(t, msg)
	}
	return RabbitMQURL()
}

// DialRabbitMQ opens a connection to the test broker (skipping the test
// as RequireRabbitMQ does when there is none), closed when the test
// ends. A test that means to break a connection opens its own.
func DialRabbitMQ(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(RequireRabbitMQ(t))
	if err != nil {
		t.Fatalf("dialling RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
