package once

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// The read API: what the console, the CLI, metrics and applications see
// of the action log. Everything outside the engine reads through these,
// never through the Store, so the store stays the engine's port.

// Get returns the action stored under key, or an error matching
// ErrNotFound.
func (c *Client) Get(ctx context.Context, key Key) (Action, error) {
	return c.store.Get(ctx, key)
}

// List returns the actions matching f, most recently updated first.
func (c *Client) List(ctx context.Context, f Filter) ([]Action, error) {
	return c.store.List(ctx, f)
}

// Events returns an action's trail, oldest first, all of it; EventPage
// reads a long one a page at a time.
func (c *Client) Events(ctx context.Context, key Key) ([]Event, error) {
	return c.store.Events(ctx, key)
}

// RecentEvents returns the newest events of the given types across all
// actions, newest first (every type when types is empty).
func (c *Client) RecentEvents(ctx context.Context, types []EventType, limit int) ([]Event, error) {
	return c.store.RecentEvents(ctx, types, limit)
}

// Stats counts actions by kind and status.
func (c *Client) Stats(ctx context.Context) ([]StatusCount, error) {
	return c.store.Stats(ctx)
}

// SchemaVersion returns the newest schema migration applied to the
// store, 0 if none: a health check compares it with what this build
// expects.
func (c *Client) SchemaVersion(ctx context.Context) (int, error) {
	return c.store.Version(ctx)
}

// Errors of Find.
var (
	// ErrNotAKey: what was given is neither a key nor 8 or more of its
	// first characters (hex).
	ErrNotAKey = errors.New("once: not a key; give the key, or at least 8 of its first characters (hex)")
	// ErrAmbiguousKey: more than one key starts with the prefix given.
	ErrAmbiguousKey = errors.New("once: more than one key starts with that prefix; give more of it")
)

// Find returns the action whose key is k, or whose key alone starts with
// k, as people copy keys from a listing: 8 or more hex characters, in
// either case. It answers ErrNotAKey, ErrNotFound or ErrAmbiguousKey.
func (c *Client) Find(ctx context.Context, k string) (Action, error) {
	k = strings.ToLower(k)
	if len(k) < 8 || len(k) > 64 || strings.Trim(k, "0123456789abcdef") != "" {
		return Action{}, fmt.Errorf("%w: %q", ErrNotAKey, k)
	}
	if len(k) == 64 {
		return c.Get(ctx, Key(k))
	}
	found, err := c.store.List(ctx, Filter{KeyPrefix: k, Limit: 2})
	if err != nil {
		return Action{}, err
	}
	switch len(found) {
	case 0:
		return Action{}, fmt.Errorf("%w: no key starts with %s", ErrNotFound, k)
	case 1:
		return found[0], nil
	}
	return Action{}, fmt.Errorf("%w: %s", ErrAmbiguousKey, k)
}

// ErrSchema: the database's schema is not the one this build of once
// knows: missing, older (run the migrations), or newer (a newer once
// migrated it; upgrade this one before it writes).
var ErrSchema = errors.New("once: the database's schema does not match this once")

// CheckSchema compares the schema version the database is at with the
// newest migration this build knows, and answers an error matching
// ErrSchema, naming both, when they differ. A health check and a
// long-running reaper call it: a process started before a newer once
// migrated the database must stop acting on rows it does not know.
func (c *Client) CheckSchema(ctx context.Context) error {
	known, err := c.knownSchema()
	if err != nil {
		return err
	}
	v, err := c.store.Version(ctx)
	switch {
	case err != nil:
		return err
	case v == 0:
		return fmt.Errorf("%w: the schema is missing; run `once migrate`", ErrSchema)
	case v < known:
		return fmt.Errorf("%w: the schema is at version %d, this once needs %d; run `once migrate`", ErrSchema, v, known)
	case v > known:
		return fmt.Errorf("%w: the schema is at version %d, this once knows up to %d; upgrade once", ErrSchema, v, known)
	}
	return nil
}

// knownSchema is the newest migration the store's build knows, rendered
// once: a reaper asks at every pass, a load balancer at every probe.
func (c *Client) knownSchema() (int, error) {
	c.schemaOnce.Do(func() {
		ms, err := c.store.Migrations()
		if err != nil {
			c.schemaErr = err
			return
		}
		if len(ms) > 0 {
			c.schema = ms[len(ms)-1].Version
		}
	})
	return c.schema, c.schemaErr
}

// maxRunSteps bounds RunSteps: a run is a handful of external calls, and
// one with more is read a page at a time (RunPage).
const maxRunSteps = 10000

// RunSteps returns the actions of run id in step order: its first
// 10,000 steps. RunPage reads a longer run a page at a time.
func (c *Client) RunSteps(ctx context.Context, id string) ([]Action, error) {
	return c.store.List(ctx, Filter{Run: id, ByStep: true, Limit: maxRunSteps})
}

// RunPage is one page of a run's steps.
type RunPage struct {
	// Steps are in step order (then by key), without payloads or
	// results.
	Steps []Action
	// Total is how many actions the run has.
	Total int64
	// More says steps follow: the next page starts after the last of
	// these.
	More bool
}

// RunPage returns up to limit (at most 10,000) actions of run id in step
// order, after the action at afterStep with key afterKey (none: from the
// first step), and how many actions the run has.
func (c *Client) RunPage(ctx context.Context, id string, afterStep int64, afterKey Key, limit int) (RunPage, error) {
	limit = min(max(limit, 1), maxRunSteps)
	acts, err := c.store.List(ctx, Filter{Run: id, ByStep: true, AfterStep: afterStep, AfterKey: afterKey, Brief: true, Limit: limit + 1})
	if err != nil {
		return RunPage{}, err
	}
	n, err := c.store.Count(ctx, Filter{Run: id})
	if err != nil {
		return RunPage{}, err
	}
	p := RunPage{Steps: acts, Total: n}
	if len(acts) > limit {
		p.Steps, p.More = acts[:limit], true
	}
	return p, nil
}

// Count returns how many actions match f, its limit and order aside.
func (c *Client) Count(ctx context.Context, f Filter) (int64, error) {
	return c.store.Count(ctx, f)
}

// EventPage returns one page of an action's trail and how many events
// the whole trail holds (see EventQuery).
func (c *Client) EventPage(ctx context.Context, q EventQuery) (EventPage, error) {
	return c.store.EventPage(ctx, q)
}

// Waiting returns released actions that no delivery has claimed within
// the RedriveAfter their kind recorded at the claim: effects that will
// not run unless their job is delivered again (see KindPolicy.Redrive).
// At most limit, the longest waiting first. Action.Redrive says whether
// the application that claimed one has a hook to re-drive it.
func (c *Client) Waiting(ctx context.Context, limit int) ([]Action, error) {
	return c.store.List(ctx, Filter{Waiting: true, OldestFirst: true, Limit: limit})
}
