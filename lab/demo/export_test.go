package demo

// MailServer is the demo's own SMTP server, which a test runs as the
// "external" server behind Options.SMTP and asks what it really accepted.
type MailServer = mailServer

func StartMailServer() (*MailServer, error) { return startMailServer() }

func (m *mailServer) Addr() string { return m.addr() }
func (m *mailServer) Close()       { m.close() }

// Accepted is the number of messages accepted for rcpt.
func (m *mailServer) Accepted(rcpt string) int { return m.count(rcpt) }
