package riverjob_test

import (
	"context"
	"strings"
	"testing"

	"github.com/riverqueue/river"

	"github.com/oncehq/once"
	"github.com/oncehq/once/riverjob"
)

// TestLateInserterUnset re-drives through a LateInserter nobody Set: the
// hook must return an error that says what to call, not panic on a nil
// client.
func TestLateInserterUnset(t *testing.T) {
	var ins riverjob.LateInserter
	hook := riverjob.Redrive(&ins, func(a once.Action) (river.JobArgs, *river.InsertOpts, error) {
		return WelcomeArgs{UserID: "1", Redriven: riverjob.RedrivenFrom(a)}, nil, nil
	})
	err := hook(context.Background(), once.Action{Key: "k", Attempt: 1})
	if err == nil || !strings.Contains(err.Error(), "call Set") {
		t.Fatalf("re-drive through an unset LateInserter: %v; want an error that says to call Set", err)
	}
}
