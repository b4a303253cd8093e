package once

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Defaults for a kind policy's zero fields.
const (
	DefaultLease             = 2 * time.Minute
	DefaultMaxExecution      = 5 * time.Minute
	DefaultRetention         = 30 * 24 * time.Hour
	DefaultMaxVerifyFailures = 5
	// DefaultMaxResultBytes bounds a stored result unless
	// Config.MaxResultBytes says otherwise.
	DefaultMaxResultBytes = 256 << 10
	// DefaultRecordTimeout bounds how long an outcome is retried against
	// an unreachable database before Do gives up with ErrNotRecorded.
	DefaultRecordTimeout = 30 * time.Second
	// DefaultClaimTimeout bounds one claim's wait for the database.
	DefaultClaimTimeout = 5 * time.Second
)

// Config configures a Client. Only Store is required.
type Config struct {
	// Store is the database that arbitrates claims: postgres.New for
	// many machines, sqlite.Open for one. Required.
	Store Store
	// Default is the policy for kinds not named in Kinds. Zero fields take
	// the package defaults.
	Default KindPolicy
	// Kinds holds per-kind policies; zero fields take Default's.
	Kinds map[string]KindPolicy
	// MaxPayloadBytes bounds an intent's canonical payload. Zero means
	// DefaultMaxPayloadBytes (1 MiB).
	MaxPayloadBytes int
	// MaxResultBytes bounds a stored result. Zero means
	// DefaultMaxResultBytes (256 KiB).
	MaxResultBytes int
	// ClaimTimeout bounds how long one claim may wait for the database:
	// a claim on a key that a caller's open transaction (DoTx) holds
	// waits on its row lock, and after this long Do answers
	// *InFlightError instead of holding a connection for as long as the
	// transaction lasts. It bounds each call recovery and Resolve make
	// too, so one connection that hangs instead of failing cannot stop
	// the reaper. Zero means DefaultClaimTimeout (5 seconds).
	ClaimTimeout time.Duration
	// RecordTimeout bounds how long Do keeps retrying to record an
	// outcome when the database is unreachable. Zero means
	// DefaultRecordTimeout (30 seconds).
	RecordTimeout time.Duration
	// Origin names this process in every event it writes, so an
	// operator can tell which machine claimed, recovered or decided.
	// Empty means host:pid. At most 255 bytes.
	Origin string
	// Logger receives a line for every transition worth an operator's
	// attention. Nil discards.
	Logger *slog.Logger
	// Hooks are called on every transition; see Hooks.
	Hooks Hooks
}

// Client runs effects exactly once over a Store. It is safe for
// concurrent use; make one per process and share it.
type Client struct {
	settings
	// carried is the policy of one kind Config.Kinds does not name, as a
	// remote worker's claim carried it (Carrying).
	carried *carriedKind
	// schema is the newest migration the store knows (knownSchema).
	schemaOnce sync.Once
	schema     int
	schemaErr  error
}

// settings are what New made of a Config: all a Client is but what it
// learns as it runs, so Carrying copies them whole, and a setting added
// later is not missing from carried clients.
type settings struct {
	store         Store
	def           KindPolicy
	kinds         map[string]KindPolicy
	maxPayload    int
	maxResult     int
	recordTimeout time.Duration
	claimTimeout  time.Duration
	log           *slog.Logger
	hooks         Hooks
	// verifiable says which VerifyThenDecide actions this client takes.
	verifiable Verifiable
	// origin is Config.Origin, or host:pid.
	origin string
}

// New validates cfg and returns a Client. It does no I/O: call the
// store's Migrate (or `once migrate`) before the first Do.
func New(cfg Config) (*Client, error) {
	if cfg.Store == nil {
		return nil, errors.New("once: Config.Store is nil; pass postgres.New(pool) or sqlite.Open(path)")
	}
	if err := cfg.Default.validate("Default"); err != nil {
		return nil, err
	}
	def := cfg.Default.withDefaults(packageDefaults)
	if err := def.validateMerged("Default", cfg.Default); err != nil {
		return nil, err
	}
	if cfg.MaxPayloadBytes < 0 || cfg.MaxResultBytes < 0 || cfg.RecordTimeout < 0 || cfg.ClaimTimeout < 0 {
		return nil, errors.New("once: Config.MaxPayloadBytes, MaxResultBytes, RecordTimeout and ClaimTimeout must not be negative; zero means the default")
	}
	c := &Client{settings: settings{
		store:         cfg.Store,
		def:           def,
		kinds:         make(map[string]KindPolicy, len(cfg.Kinds)),
		maxPayload:    orDefault(cfg.MaxPayloadBytes, DefaultMaxPayloadBytes),
		maxResult:     orDefault(cfg.MaxResultBytes, DefaultMaxResultBytes),
		recordTimeout: orDefault(cfg.RecordTimeout, DefaultRecordTimeout),
		claimTimeout:  orDefault(cfg.ClaimTimeout, DefaultClaimTimeout),
		log:           cfg.Logger,
		hooks:         cfg.Hooks,
	}}
	for kind, p := range cfg.Kinds {
		if kind == "" {
			return nil, errors.New("once: Config.Kinds has an empty kind name")
		}
		name := fmt.Sprintf("Kinds[%q]", kind)
		if err := p.validate(name); err != nil {
			return nil, err
		}
		raw := p
		p = p.withDefaults(c.def)
		if err := p.validateMerged(name, raw); err != nil {
			return nil, err
		}
		c.kinds[kind] = p
	}
	// A process takes the VerifyThenDecide actions of the kinds it names
	// (deciding them with their verifier, or asking a person when it
	// configures the kind without one), and of every other kind when its
	// Default has a verifier; the rest wait for a process that does.
	// The store is told which recorded recoveries these are, as data.
	for _, r := range Recoveries() {
		if r.KindOnly() {
			c.verifiable.Recoveries = append(c.verifiable.Recoveries, r.String())
		}
	}
	c.verifiable.Others = c.def.Verifier != nil
	for kind := range c.kinds {
		c.verifiable.Kinds = append(c.verifiable.Kinds, kind)
		c.verifiable.Except = append(c.verifiable.Except, kind)
	}
	c.origin = cfg.Origin
	if c.origin == "" {
		host, _ := os.Hostname()
		c.origin = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if len(c.origin) > MaxIDBytes || !utf8.ValidString(c.origin) || strings.ContainsRune(c.origin, 0) {
		return nil, errors.New("once: Config.Origin must be valid UTF-8 text of at most 255 bytes, without NUL")
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c, nil
}

// Origin returns the name this client writes into every event.
func (c *Client) Origin() string { return c.origin }

// MaxResultBytes returns the bound on a stored result
// (Config.MaxResultBytes, or its default). A layer that stores what it
// is handed (idemhttp's responses) checks its result against it, to
// store a smaller one of its own rather than put the action up for
// review.
func (c *Client) MaxResultBytes() int { return c.maxResult }

// takesVerify reports whether this client takes the VerifyThenDecide
// actions of kind (see Verifiable).
func (c *Client) takesVerify(kind string) bool {
	_, named := c.kinds[kind]
	return named || c.def.Verifier != nil
}

// refused are the recoveries of a released action of kind that this
// client must not claim again: those only a process with the kind's
// verifier takes, when it has none for the kind.
func (c *Client) refused(kind string) []string {
	if c.takesVerify(kind) {
		return nil
	}
	return c.verifiable.Recoveries
}

// call bounds one store call that recovery or a resolution makes.
func (c *Client) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.claimTimeout)
}

func orDefault[N int | time.Duration](v, d N) N {
	if v == 0 {
		return d
	}
	return v
}

// Configured reports whether Config.Kinds names kind: for any other,
// Policy answers Config.Default's policy, which a process that knows
// nothing of the kind (once serve) has, not the kind's own.
func (c *Client) Configured(kind string) bool {
	_, ok := c.kinds[kind]
	return ok
}

// Policy returns the policy in force for kind.
func (c *Client) Policy(kind string) KindPolicy {
	if p, ok := c.kinds[kind]; ok {
		return p
	}
	if c.carried != nil && c.carried.kind == kind {
		return c.carried.pol
	}
	return c.def
}

type carriedKind struct {
	kind string
	pol  KindPolicy
}

// Carrying returns a copy of c whose policy for kind is p over
// Config.Default: what a server uses for a remote worker whose claim
// carries its own policy, as a Go worker's Config would. Only a kind
// Config.Kinds does not name may be carried (a kind c configures is
// pinned, and a worker cannot weaken it), and only what needs nothing
// of this process: p may set Lease, MaxExecution, Retention and
// Recovery AskPerson or RetryWithProviderKey, not a verifier, a
// re-drive or an approval. The copy takes the same VerifyThenDecide
// actions as c, and no others. It does no I/O.
func (c *Client) Carrying(kind string, p KindPolicy) (*Client, error) {
	switch {
	case kind == "":
		return nil, fmt.Errorf("once: Carrying needs a kind: %w", ErrInvalidIntent)
	case c.Configured(kind):
		return nil, fmt.Errorf("once: kind %q is configured here, and its policy pinned: a carried one cannot change it: %w", kind, ErrInvalidIntent)
	case p.Recovery == VerifyThenDecide || p.Verifier != nil:
		return nil, fmt.Errorf("once: a carried policy cannot verify (kind %q): a verifier is the configuring process's; configure the kind where its verifier runs: %w", kind, ErrInvalidIntent)
	case p.Redrive != nil || p.RedriveAfter != 0 || p.Approval.set() || p.Approval.Expiry != 0 || p.Approval.OnExpiry != "" || p.MaxVerifyFailures != 0 || p.VerifyBackoff != 0:
		return nil, fmt.Errorf("once: a carried policy sets Lease, MaxExecution, Retention and Recovery only (kind %q): %w", kind, ErrInvalidIntent)
	}
	name := fmt.Sprintf("carried policy of %q", kind)
	if err := p.validate(name); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrInvalidIntent)
	}
	raw := p
	p = p.withDefaults(c.def)
	if err := p.validateMerged(name, raw); err != nil {
		return nil, fmt.Errorf("%w: %w", err, ErrInvalidIntent)
	}
	return &Client{settings: c.settings, carried: &carriedKind{kind: kind, pol: p}}, nil
}

// prepare validates an intent and turns it into a claim request. It is
// the last step before I/O: anything wrong with the input fails here.
func (c *Client) prepare(in Intent) (ClaimRequest, KindPolicy, error) {
	payload, key, fp, err := in.validate(c.maxPayload, true)
	if err != nil {
		return ClaimRequest{}, KindPolicy{}, err
	}
	pol := c.Policy(in.Kind)
	req := ClaimRequest{
		Key: key, Fingerprint: fp,
		Run: in.Run, Step: in.Step, Kind: in.Kind, Target: in.Target,
		Payload: payload, Lease: pol.storedLease(), Origin: c.origin, Recovery: pol.Recovery, Retention: pol.Retention,
		RedriveAfter: pol.RedriveAfter, Redrive: pol.Redrive != nil,
		Unconfigured: !c.Configured(in.Kind), Refuse: c.refused(in.Kind),
	}
	if pol.Approval.set() {
		need, err := pol.Approval.needs(in)
		if err != nil {
			return ClaimRequest{}, KindPolicy{}, err
		}
		if need {
			req.Approval, req.OnExpiry = pol.Approval.Expiry, pol.Approval.OnExpiry
		}
	}
	return req, pol, nil
}
