package browser_test

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/oncehq/once"
	"github.com/oncehq/once/console"
	"github.com/oncehq/once/console/internal/consoletest"
)

// The fixtures are consoletest's, which the console package's own tests
// share.

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var mounts = consoletest.Mounts

// bundle is a console over consoletest's log of three actions.
type bundle struct {
	client *once.Client
	// h is what requests go through: the console itself, or the
	// application's mux it is mounted on.
	h      http.Handler
	prefix string
	review once.Key
}

func setup(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	l := consoletest.NewLog(t)
	cfg.Client = l.Client
	b := &bundle{client: l.Client, review: l.Review}
	_, b.h, b.prefix = consoletest.Serve(t, cfg)
	return b
}

// url is the console's page p as the browser sees it, prefix included.
func (b *bundle) url(p string) string { return b.prefix + p }

var kindsLog = consoletest.KindsLog
