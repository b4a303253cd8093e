package cli

import "time"

// SetServeLimits lowers `once serve`'s connection cap to maxConns and
// every timeout of its server to timeout, until restore.
func SetServeLimits(maxConns int, timeout time.Duration) (restore func()) {
	old := limits
	limits = serveLimits{readHeader: timeout, read: timeout, write: timeout, idle: timeout, maxConns: maxConns}
	return func() { limits = old }
}
