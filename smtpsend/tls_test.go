package smtpsend_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/oncehq/once/smtpsend"
)

// selfSigned returns a server certificate for localhost and a client
// configuration that trusts it.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "localhost"}
}

func TestSendStartTLSAndAuth(t *testing.T) {
	serverTLS, clientTLS := selfSigned(t)
	srv := startServerTLS(t, serverTLS)

	s := &smtpsend.Sender{
		Addr:    srv.addr(),
		TLS:     clientTLS,
		Auth:    sasl.NewPlainClient("", "ada", "secret"),
		Timeout: 10 * time.Second,
	}
	got, err := s.Send(context.Background(), attempt(t, 1), message())
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if got != "250 2.0.0 OK: queued" {
		t.Errorf("result %q", got)
	}
	if l := srv.loggedIn(); len(l) != 1 || l[0].user != "ada" || !l[0].tls {
		t.Errorf("logins %+v, want ada once, over TLS", l)
	}
	if n := len(srv.messages()); n != 1 {
		t.Errorf("server read %d messages, want 1", n)
	}

	// Refused credentials: nothing was sent, and nothing is.
	s.Auth = sasl.NewPlainClient("", "ada", "wrong")
	_, err = s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("bad password: class %s (%v), want retry-later", c, err)
	}
	if n := len(srv.messages()); n != 1 {
		t.Errorf("server read %d messages after a refused login, want still 1", n)
	}
}

// Sender.TLS makes STARTTLS required: a server that does not offer it
// does not get the message in clear.
func TestSendTLSRequiredButNotOffered(t *testing.T) {
	srv := startServer(t) // no TLSConfig: no STARTTLS
	_, clientTLS := selfSigned(t)
	s := &smtpsend.Sender{Addr: srv.addr(), TLS: clientTLS, Timeout: 10 * time.Second}
	_, err := s.Send(context.Background(), attempt(t, 1), message())
	if c := class(err); c != "retry-later" {
		t.Fatalf("class %s (%v), want retry-later", c, err)
	}
	if n := len(srv.messages()); n != 0 {
		t.Errorf("server read %d messages, want none", n)
	}
}
