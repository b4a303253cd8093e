package once_test

import (
	"errors"
	"fmt"

	"github.com/oncehq/once"
)

// A job's action prints as the word logs use for it.
func ExampleJobAction_String() {
	for _, err := range []error{nil, once.RetryLater(errors.New("not yet")), once.Permanent(errors.New("no such job"))} {
		fmt.Println(once.Dispose(err).Action)
	}
	// Output:
	// ack
	// retry
	// drop
}
