package natsjs

import "time"

// SetLookupRetry sets how long w keeps a failed lookup of a consumer
// before asking again.
func SetLookupRetry(w *Worker, d time.Duration) { w.lookupRetry = d }
