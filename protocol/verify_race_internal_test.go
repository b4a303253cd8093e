package protocol

import (
	"context"
	"testing"

	"github.com/oncehq/once"
)

// TestAnswerReceivedIsTheAnswerUsed: a client verifier told its answer
// was received (answer's ok) must have given the recoverer that answer.
// When the recoverer's time ran out just as the answer came, the answer
// was taken and reported received, and the recoverer returned "did not
// answer in time" all the same: the verdict was lost, counted as a
// verifier that could not tell, while the verifier's side said
// received.
func TestAnswerReceivedIsTheAnswerUsed(t *testing.T) {
	v := NewVerifiers()
	ask := v.For("k")
	lost := 0
	const tries = 300
	for range tries {
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() {
			landed, _, err := ask(ctx, once.Action{Key: "key", Kind: "k", Attempt: 1})
			if err == nil && !landed {
				t.Error("the verdict was landed; the recoverer got not landed")
			}
			got <- err
		}()
		take, stop := context.WithCancel(context.Background())
		qs := v.take(take, []string{"k"}, 1)
		stop()
		if len(qs) != 1 {
			t.Fatalf("took %d questions; want 1", len(qs))
		}
		cancel()
		ok, _ := v.answer(qs[0].id, verdict{landed: true}, VerdictLanded)
		if err := <-got; ok && err != nil {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d answers were reported received and not used: the recoverer gave up (%s)", lost, tries, "did not answer in time")
	}
}
