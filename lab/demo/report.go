package demo

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteText prints the report as `once demo` does: what ran, the table,
// and where the counts come from. A count that is only a bound is marked
// in the table (≥ a lower bound, ≤ an upper one) and its range is
// spelled out below it, so the table never shows fewer duplicates than
// happened without saying so.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%d emails, sent twice over: once by \"check, then send\", once through once.\n", r.Intents)
	fmt.Fprintf(&b, "Worker processes (%d at a time) were killed with SIGKILL %d times, some right between the SMTP\n", r.Workers, r.Kills)
	fmt.Fprintf(&b, "server's acceptance and the record; the queue redelivered every job they held. (%.1fs)\n\n", r.Seconds)
	tw := tabwriter.NewWriter(&b, 0, 0, 3, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tintents\tdelivered\tduplicates\tfor review\tsilently lost\t")
	fmt.Fprintf(tw, "check, then send\t%d\t%s\t%s\t-\t%s\t\n", r.Intents,
		cell(r.Naive.Delivered, r.Naive.DeliveredAtMost), cell(r.Naive.Duplicates, r.Naive.DuplicatesAtMost), cell(r.Naive.Lost, r.Naive.LostAtLeast))
	fmt.Fprintf(tw, "once\t%d\t%s\t%s\t%d\t%s\t\n", r.Intents,
		cell(r.Once.Delivered, r.Once.DeliveredAtMost), cell(r.Once.Duplicates, r.Once.DuplicatesAtMost), r.Once.Review, cell(r.Once.Lost, r.Once.LostAtLeast))
	tw.Flush()
	b.WriteString("\n")
	switch {
	case r.Counted == countedByServer:
		fmt.Fprintf(&b, "Counted by %s at %s.\n", r.Counted, r.SMTP)
	case r.Exact:
		fmt.Fprintf(&b, "Counted from the workers' log of the replies of %s: every send's reply was logged, so\n", r.SMTP)
		b.WriteString("the counts are exact.\n")
	default:
		n, have, them := r.Naive.SendsUnknown+r.Once.SendsUnknown, "have", "any of them"
		if n == 1 {
			have, them = "has", "it"
		}
		fmt.Fprintf(&b, "Counted from the workers' log of the replies of %s, not by the server: %s %s\n", r.SMTP, sends(n), have)
		fmt.Fprintf(&b, "no logged reply (a worker was killed mid-send, or no reply came), and the server may have\n")
		fmt.Fprintf(&b, "accepted %s. ≥ marks a lower bound, ≤ an upper one:\n", them)
		for _, h := range []struct {
			label string
			n     Bounds
			c     [3]int // delivered, duplicates, lost
		}{
			{"check, then send", r.Naive.Bounds, [3]int{r.Naive.Delivered, r.Naive.Duplicates, r.Naive.Lost}},
			{"once", r.Once.Bounds, [3]int{r.Once.Delivered, r.Once.Duplicates, r.Once.Lost}},
		} {
			if h.n.SendsUnknown == 0 {
				continue
			}
			var ranges []string
			if h.n.DeliveredAtMost != h.c[0] {
				ranges = append(ranges, fmt.Sprintf("delivered ≥ %d (up to %d)", h.c[0], h.n.DeliveredAtMost))
			}
			if h.n.DuplicatesAtMost != h.c[1] {
				ranges = append(ranges, fmt.Sprintf("duplicates ≥ %d (up to %d)", h.c[1], h.n.DuplicatesAtMost))
			}
			if h.n.LostAtLeast != h.c[2] {
				ranges = append(ranges, fmt.Sprintf("silently lost ≤ %d (at least %d)", h.c[2], h.n.LostAtLeast))
			}
			if len(ranges) == 0 {
				ranges = append(ranges, "no count changes")
			}
			fmt.Fprintf(&b, "  %s: %s whose reply no worker logged, so %s\n", h.label, sends(h.n.SendsUnknown), strings.Join(ranges, ", "))
		}
		fmt.Fprintf(&b, "The server's own log has the exact counts: each intent went to its own recipient,\n%s.\n", r.Recipients)
	}
	if r.Once.Review > 0 {
		fmt.Fprintf(&b, "The %d for review are sends whose worker died before it could record them: plain SMTP\n", r.Once.Review)
		fmt.Fprintln(&b, "cannot be asked whether it delivered, so once asks a person instead of sending twice.")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell shows a count whose range runs from it to other: the number alone
// when they agree, else marked as the lower or upper bound it is.
func cell(n, other int) string {
	switch {
	case other > n:
		return "≥" + strconv.Itoa(n)
	case other < n:
		return "≤" + strconv.Itoa(n)
	default:
		return strconv.Itoa(n)
	}
}

func sends(n int) string {
	if n == 1 {
		return "1 send"
	}
	return strconv.Itoa(n) + " sends"
}
