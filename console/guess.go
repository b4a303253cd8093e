package console

import (
	"log/slog"
	"math"
	"sync"
	"time"
)

// Wrong tokens are limited per client address (an IPv4 address, or an
// IPv6 /64): each address has a bucket of guessBurst attempts that
// refills one every guessEvery. Once it is spent, every request from
// that address that carries a token (header, cookie or ?token=) gets 429
// with Retry-After and is not checked at all, right token or wrong:
// answering a right one would tell a guesser when it hit. So a mistyped
// token costs a person nothing, and a guesser gets ten tries a minute.
const (
	guessBurst = 10
	guessEvery = 6 * time.Second
	// guessAddrs bounds the table of addresses that sent a wrong token.
	// When it is full of addresses still limited, new ones share one
	// bucket: a guesser with more addresses than this slows every new
	// address down rather than guessing faster.
	guessAddrs = 4096
	// An address's failures are logged at its first, when it is limited,
	// and then at most once a minute with the count since; and at most
	// logBurst lines a minute go out for all addresses together.
	logEvery = time.Minute
	logBurst = 60
)

type guessLimit struct {
	mu    sync.Mutex
	addrs map[string]*bucket
	// over is the bucket the addresses beyond a full table share; nil
	// until the table first fills. sweptAt is when the table was last
	// cleared of refilled buckets: not more than once per guessEvery,
	// since none refills faster.
	over    *bucket
	sweptAt time.Time
	// lines is the log's own bucket; dropped counts the times a line
	// was due and held back for want of one, told in the next line that
	// goes out (an address whose line was held back tries again at its
	// next failure).
	lines   float64
	linesAt time.Time
	dropped int
}

type bucket struct {
	tokens   float64
	at       time.Time // when tokens was counted
	limited  bool      // the last log line said the bucket was spent
	unlogged int       // wrong tokens not yet in a log line
	// unchecked counts the tokens refused 429 without being checked,
	// not yet in a log line: right or wrong, no one knows, so they are
	// not counted as wrong (TestGuessLogCountsOnlyWrongTokens).
	unchecked int
	loggedAt  time.Time
}

func newGuessLimit() *guessLimit {
	return &guessLimit{addrs: map[string]*bucket{}, lines: logBurst}
}

// refill brings b's count up to now.
func (b *bucket) refill(now time.Time) {
	b.tokens = math.Min(guessBurst, b.tokens+float64(now.Sub(b.at))/float64(guessEvery))
	b.at = now
}

// attempt counts a token from addr, right or not (compared before, in
// constant time), and says how long addr must wait before a token from
// it is checked; zero means this one was: a wrong one spent an attempt.
// The wait is read and the attempt spent under one lock: read and spent
// in two steps, requests in flight together all passed the read before
// any spent, and one address guessed past its burst
// (TestConcurrentGuessesKeepTheBurst).
func (g *guessLimit) attempt(log *slog.Logger, addr, via string, right bool, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.waitLocked(addr, now); d > 0 {
		g.failLocked(log, addr, via, true, now)
		return d
	}
	if !right {
		g.failLocked(log, addr, via, false, now)
	}
	return 0
}

// waitLocked says how long addr must wait before a token from it is
// checked again; zero means now. g.mu is held.
func (g *guessLimit) waitLocked(addr string, now time.Time) time.Duration {
	b := g.addrs[addr]
	if b == nil {
		if len(g.addrs) < guessAddrs || g.over == nil {
			return 0
		}
		b = g.over
	}
	b.refill(now)
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) * float64(guessEvery))
}

// failLocked spends one of addr's attempts on a wrong token (or counts
// one refused for being over the limit) and logs it if it is time to.
// g.mu is held.
func (g *guessLimit) failLocked(log *slog.Logger, addr, via string, refused bool, now time.Time) {
	b := g.bucketFor(addr, now)
	b.refill(now)
	if refused {
		b.unchecked++
	} else {
		b.tokens = math.Max(0, b.tokens-1)
		b.unlogged++
	}
	first := b.loggedAt.IsZero()
	newlyLimited := b.tokens < 1 && !b.limited
	if !first && !newlyLimited && now.Sub(b.loggedAt) < logEvery {
		return
	}
	g.lines = math.Min(logBurst, g.lines+float64(now.Sub(g.linesAt))/float64(logEvery/logBurst))
	g.linesAt = now
	if g.lines < 1 {
		g.dropped++
		return
	}
	g.lines--
	if b == g.over {
		addr = "(addresses beyond the table)"
	}
	attrs := []any{"remote", addr, "via", via, "failures", b.unlogged}
	if b.unchecked > 0 {
		attrs = append(attrs, "unchecked", b.unchecked)
	}
	if b.tokens < 1 {
		attrs = append(attrs, "limited", true)
	}
	if g.dropped > 0 {
		attrs = append(attrs, "lines_dropped", g.dropped)
		g.dropped = 0
	}
	msg := "console: wrong token"
	if b.unlogged == 0 {
		msg = "console: tokens refused unchecked"
	}
	log.Warn(msg, attrs...)
	b.unlogged, b.unchecked, b.loggedAt = 0, 0, now
	b.limited = b.tokens < 1
}

// bucketFor returns addr's bucket, making one if need be. A full table
// first forgets the addresses whose buckets have refilled; if none has,
// the new address shares the overflow bucket.
func (g *guessLimit) bucketFor(addr string, now time.Time) *bucket {
	if b := g.addrs[addr]; b != nil {
		return b
	}
	if len(g.addrs) >= guessAddrs && now.Sub(g.sweptAt) >= guessEvery {
		g.sweptAt = now
		for k, b := range g.addrs {
			if b.refill(now); b.tokens >= guessBurst {
				delete(g.addrs, k)
			}
		}
	}
	if len(g.addrs) >= guessAddrs {
		if g.over == nil {
			g.over = &bucket{tokens: guessBurst, at: now}
		}
		return g.over
	}
	b := &bucket{tokens: guessBurst, at: now}
	g.addrs[addr] = b
	return b
}
