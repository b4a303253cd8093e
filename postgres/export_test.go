package postgres

import "time"

// Knobs for the tests of postgres_test. They must be set before the
// store's first wait starts its listener.

// SetPollInterval spaces a waiter's reads of its row by d: an hour
// leaves notifications as the only way to be woken.
func SetPollInterval(s *Store, d time.Duration) { s.pollMin, s.pollMax = d, d }

// SetListenTimings sets how long the listener waits before connecting
// again and how long its self-check waits for its own notification.
func SetListenTimings(s *Store, reconnect, probe time.Duration) {
	s.listen.backoffMin, s.listen.backoffMax, s.listen.probeWait = reconnect, reconnect, probe
}

// SetListenCallWait bounds how long the listener waits for its LISTEN
// to be answered.
func SetListenCallWait(s *Store, d time.Duration) { s.listen.callWait = d }

// ListenerPID is the backend of the store's listening connection, 0 when
// none is open.
func ListenerPID(s *Store) uint32 {
	if s.listen == nil {
		return 0
	}
	return s.listen.listenerPID()
}

// ListenerReady reports whether the listening connection is open and its
// own notification came back.
func ListenerReady(s *Store) bool { return s.listen != nil && s.listen.state.Load() == listenReady }

// ListenerUnavailable reports whether the self-check found notifications
// lost.
func ListenerUnavailable(s *Store) bool {
	return s.listen != nil && s.listen.state.Load() == listenUnavailable
}

// SetBeforeBatch has f run before each batch the store's runners send,
// with the batch's size; a test holds the runners in f to let requests
// queue up. It must be set before the store's first claim.
func SetBeforeBatch(s *Store, f func(n int)) { s.batch.beforeBatch = f }

// Queued is how many requests wait for the store's runners.
func Queued(s *Store) int { return s.batch.queued() }

// BatchRunners is how many batches the store sends at once, 0 without
// group commit.
func BatchRunners(s *Store) int {
	if s.batch == nil {
		return 0
	}
	return s.batch.runners
}
