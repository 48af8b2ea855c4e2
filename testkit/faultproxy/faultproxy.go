// Package faultproxy is a TCP proxy that sits between a PostgreSQL client and
// server and breaks the connection at chosen points of the wire protocol. The
// fault tests use it to lose a request before the server sees it, or an
// answer after the server acted on it (a COMMIT that committed but whose
// CommandComplete never arrives).
//
// The proxy parses the protocol only as far as faults need: the startup
// packet (an SSLRequest or GSSENCRequest is refused with 'N', a
// CancelRequest is passed through), then every message's type and length,
// the SQL of Query, Parse, Bind and Execute, the tag of CommandComplete, the
// status of ReadyForQuery and the SQLSTATE of ErrorResponse. A Rule sees each
// message before it is forwarded and decides its fate.
//
// It listens on a loopback port only, and bounds both the number of
// connections and the size of a message.
package faultproxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// Limits of one proxy.
const (
	// MaxConns is how many client connections may be open at once; further
	// ones are closed on accept.
	MaxConns = 128
	// MaxMessage is the largest message forwarded, header included; a larger
	// one cuts the connection.
	MaxMessage = 64 << 20

	dialTimeout = 10 * time.Second
)

// Startup packet codes (PostgreSQL protocol, "Message Formats").
const (
	sslRequestCode    = 80877103
	gssencRequestCode = 80877104
	cancelRequestCode = 80877102
)

// Action is what happens to a message and its connection.
type Action int

// The fates of messages that arrive after a rule ended the connection:
// dropped after a cut (nothing more is forwarded, and the connection
// closes), discarded during a partition (read and thrown away, the sockets
// kept open).
const (
	dropped   Action = -1
	discarded Action = -2
)

const (
	// Pass forwards the message.
	Pass Action = iota
	// CutBefore closes both sides of the connection; the message and
	// everything after it are lost, everything before it is delivered.
	CutBefore
	// CutAfter forwards the message, then closes both sides.
	CutAfter
	// Blackhole forwards neither the message nor anything after it in the
	// same direction, and leaves both sides open, as a network that lost its
	// route: the peers notice only through their own timeouts. If a peer
	// closes its side, the proxy closes the other.
	Blackhole
	// Partition forwards neither the message nor anything after it in
	// either direction, and hides each peer's close from the other: a
	// network partition between two live hosts, which each side notices
	// only through its own timeouts. The peer that closes sees its own
	// socket close; the other keeps waiting until CutAll or Close.
	Partition
	// FatalBefore delivers, in place of a server message, the FATAL
	// ErrorResponse (SQLSTATE 57P01) that pg_terminate_backend makes the
	// server send, then closes both sides: the session ended instead of
	// answering.
	FatalBefore
	// FatalAfter forwards a server message, then delivers that
	// FATAL and closes both sides: the session ended right after answering,
	// as when a termination arrives between COMMIT's reply and the
	// pipeline's closing ReadyForQuery.
	FatalAfter
)

// fatalMessage is the ErrorResponse of a terminated backend.
var fatalMessage = func() []byte {
	var body []byte
	for _, f := range [][2]string{
		{"S", "FATAL"}, {"V", "FATAL"}, {"C", "57P01"},
		{"M", "terminating connection due to administrator command"},
	} {
		body = append(body, f[0][0])
		body = append(body, f[1]...)
		body = append(body, 0)
	}
	body = append(body, 0)
	msg := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)+4))
	return append(msg, body...)
}()

func (a Action) String() string {
	switch a {
	case Pass:
		return "pass"
	case CutBefore:
		return "cut before"
	case CutAfter:
		return "cut after"
	case Blackhole:
		return "blackhole"
	case Partition:
		return "partition"
	case FatalBefore:
		return "fatal before"
	case FatalAfter:
		return "fatal after"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Message is one protocol message seen by the proxy.
type Message struct {
	// Conn numbers the client connection, from 1 in accept order.
	Conn int
	// FromClient is true for frontend messages, false for backend ones.
	FromClient bool
	// Type is the message type byte: 'Q', 'P', 'B', 'E', 'S' from the
	// client; 'C', 'Z', 'D', 'E' from the server. The startup packet is
	// not shown to rules.
	Type byte
	// SQL is the statement text: the query of Query and Parse, the
	// statement bound by Bind and run by Execute, and for server messages
	// the statement being answered, when known.
	SQL string
	// Tag is the command tag of a CommandComplete, e.g. "COMMIT" or
	// "INSERT 0 1".
	Tag string
	// TxStatus is the status of a ReadyForQuery: 'I', 'T' or 'E'.
	TxStatus byte
	// SQLState is the code of an ErrorResponse, e.g. "40001".
	SQLState string
	// Body is the message without its header. It is valid only during the
	// call of the Rule.
	Body []byte
}

func (m Message) String() string {
	dir := "S"
	if m.FromClient {
		dir = "C"
	}
	s := fmt.Sprintf("#%d %s %q", m.Conn, dir, m.Type)
	if m.Tag != "" {
		s += " " + m.Tag
	}
	if m.SQL != "" {
		s += " " + abbreviate(m.SQL)
	}
	return s
}

// A Rule decides the fate of each message. The proxy calls it for every
// message of every connection, one call at a time, so a Rule may keep state
// without locking. A Rule must not call the Proxy's methods.
type Rule func(Message) Action

// A Match selects messages. Matches built by Nth keep state, so use each
// one in a single rule.
type Match func(Message) bool

// Once returns a rule that answers a for the first message match selects
// and Pass for every other message, before and after.
func Once(match Match, a Action) Rule {
	done := false
	return func(m Message) Action {
		if !done && match(m) {
			done = true
			return a
		}
		return Pass
	}
}

// FromClient selects every frontend message.
func FromClient(m Message) bool { return m.FromClient }

// FromServer selects every backend message.
func FromServer(m Message) bool { return !m.FromClient }

// ClientType selects frontend messages of type t.
func ClientType(t byte) Match {
	return func(m Message) bool { return m.FromClient && m.Type == t }
}

// ServerType selects backend messages of type t.
func ServerType(t byte) Match {
	return func(m Message) bool { return !m.FromClient && m.Type == t }
}

// ClientSQL selects the frontend Query, Parse, Bind and Execute messages
// whose statement, leading comments and space aside, starts with prefix
// (case-insensitive): ClientSQL("commit"). Parse carries the text only when
// a statement is first prepared and Bind when it runs, so the first match on
// a connection is the first moment the statement leaves the client.
func ClientSQL(prefix string) Match {
	prefix = strings.ToLower(prefix)
	return func(m Message) bool {
		return m.FromClient && carriesSQL(m.Type) &&
			strings.HasPrefix(strings.ToLower(StripComments(m.SQL)), prefix)
	}
}

// ClientSQLContains selects the frontend Query, Parse, Bind and Execute
// messages whose statement contains s (case-insensitive).
func ClientSQLContains(s string) Match {
	s = strings.ToLower(s)
	return func(m Message) bool {
		return m.FromClient && carriesSQL(m.Type) && strings.Contains(strings.ToLower(m.SQL), s)
	}
}

// ServerTag selects the backend CommandComplete messages with tag, e.g.
// ServerTag("COMMIT").
func ServerTag(tag string) Match {
	return func(m Message) bool { return !m.FromClient && m.Type == 'C' && m.Tag == tag }
}

// Nth selects only the nth message (from 1) that match selects.
func Nth(n int, match Match) Match {
	seen := 0
	return func(m Message) bool {
		if !match(m) {
			return false
		}
		seen++
		return seen == n
	}
}

func carriesSQL(t byte) bool { return t == 'Q' || t == 'P' || t == 'B' || t == 'E' }

// StripComments returns sql without its leading space and SQL comments.
func StripComments(sql string) string {
	for {
		sql = strings.TrimLeft(sql, " \t\r\n\f")
		switch {
		case strings.HasPrefix(sql, "--"):
			i := strings.IndexByte(sql, '\n')
			if i < 0 {
				return ""
			}
			sql = sql[i+1:]
		case strings.HasPrefix(sql, "/*"):
			i := strings.Index(sql, "*/")
			if i < 0 {
				return ""
			}
			sql = sql[i+2:]
		default:
			return sql
		}
	}
}

// Proxy forwards loopback connections to a PostgreSQL server.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // ends with Close, and with it pending dials
	cancel context.CancelFunc

	mu     sync.Mutex // serializes rule calls and guards the fields below
	rule   Rule
	conns  map[*session]struct{}
	nconn  int
	cuts   int
	closed bool

	wg sync.WaitGroup
}

// Start listens on a free loopback port and forwards every connection to
// target, a host:port. Close stops it.
func Start(target string) (*Proxy, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, conns: map[*session]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetRule replaces the rule; nil passes every message. It takes effect from
// the next message.
func (p *Proxy) SetRule(r Rule) {
	p.mu.Lock()
	p.rule = r
	p.mu.Unlock()
}

// Cuts is how many times a rule answered an Action other than Pass.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Conns is how many client connections the proxy has accepted.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nconn
}

// CutAll closes every open connection, as a partition that ends in resets:
// a peer left waiting by Blackhole sees its connection fail at once.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.conns {
		s.close()
	}
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.cancel()
	err := p.ln.Close()
	for s := range p.conns {
		s.close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || len(p.conns) >= MaxConns {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.nconn++
		s := &session{p: p, id: p.nconn, client: c, gone: make(chan struct{}), stmts: map[string]string{}, portals: map[string]string{}}
		p.conns[s] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			s.run()
			p.mu.Lock()
			delete(p.conns, s)
			p.mu.Unlock()
		}()
	}
}

// session is one proxied connection.
type session struct {
	p      *Proxy
	id     int
	client net.Conn

	closeOnce sync.Once
	gone      chan struct{} // closed by close
	serverMu  sync.Mutex
	server    net.Conn
	closing   bool

	// Guarded by p.mu: whether a rule cut or partitioned the connection;
	// what the client prepared and bound, and the statements whose answers
	// are due, oldest first.
	cut         bool
	partitioned bool
	stmts       map[string]string
	portals     map[string]string
	pending     []pending
}

type pending struct {
	sql    string
	simple bool // a Query: answered until ReadyForQuery
}

func (s *session) close() {
	s.closeOnce.Do(func() {
		close(s.gone)
		s.client.Close()
		s.serverMu.Lock()
		s.closing = true
		if s.server != nil {
			s.server.Close()
		}
		s.serverMu.Unlock()
	})
}

func (s *session) run() {
	defer s.close()
	cr := bufio.NewReaderSize(s.client, 32<<10)
	startup, cancel, err := s.readStartup(cr)
	if err != nil {
		return
	}
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(s.p.ctx, "tcp", s.p.target)
	if err != nil {
		return
	}
	s.serverMu.Lock()
	if s.closing {
		s.serverMu.Unlock()
		server.Close()
		return
	}
	s.server = server
	s.serverMu.Unlock()

	if cancel {
		// A CancelRequest names the server's backend; pass it on as is and
		// let the server end the exchange.
		if _, err := server.Write(startup); err == nil {
			_, _ = io.Copy(io.Discard, server)
		}
		return
	}
	if _, err := server.Write(startup); err != nil {
		return
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pump(bufio.NewReaderSize(server, 32<<10), s.client, false)
		s.hangUp()
	}()
	s.pump(cr, server, true)
	s.hangUp()
	<-done
}

// hangUp ends the session once one direction has ended: at once, or, in a
// partition, when CutAll or Close ends it, so that the other peer never
// learns of the close.
func (s *session) hangUp() {
	s.p.mu.Lock()
	partitioned := s.partitioned
	s.p.mu.Unlock()
	if partitioned {
		<-s.gone
	}
	s.close()
}

// readStartup reads the untyped startup packet, refusing encryption
// requests until a StartupMessage or CancelRequest arrives.
func (s *session) readStartup(r *bufio.Reader) (packet []byte, cancel bool, err error) {
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, false, err
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n < 8 || n > 10000 {
			return nil, false, fmt.Errorf("faultproxy: startup packet of %d bytes", n)
		}
		packet = make([]byte, n)
		copy(packet, hdr[:])
		if _, err := io.ReadFull(r, packet[8:]); err != nil {
			return nil, false, err
		}
		switch binary.BigEndian.Uint32(hdr[4:]) {
		case sslRequestCode, gssencRequestCode:
			if _, err := s.client.Write([]byte{'N'}); err != nil {
				return nil, false, err
			}
		case cancelRequestCode:
			return packet, true, nil
		default:
			return packet, false, nil
		}
	}
}

// pump forwards typed messages from r to w until either side fails or a
// rule ends the connection. Messages are batched while more are buffered, so
// the peer sees roughly the packets the sender wrote.
func (s *session) pump(r *bufio.Reader, dst net.Conn, fromClient bool) {
	w := bufio.NewWriterSize(dst, 32<<10)
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			_ = w.Flush()
			return
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 || n > MaxMessage-1 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(r, body); err != nil {
			_ = w.Flush()
			return
		}
		act := s.decide(s.describe(fromClient, hdr[0], body))
		switch act {
		case dropped:
			return
		case discarded:
			continue
		case Partition:
			// decide has stopped both directions; deliver what came
			// before the message.
			_ = w.Flush()
			continue
		case FatalBefore:
			_, _ = w.Write(fatalMessage)
			s.apply(act, w)
			return
		case CutBefore, Blackhole:
			s.apply(act, w)
			if act == Blackhole {
				_, _ = io.Copy(io.Discard, r)
			}
			return
		}
		if _, err := w.Write(hdr[:]); err != nil {
			return
		}
		if _, err := w.Write(body); err != nil {
			return
		}
		if act == FatalAfter {
			_, _ = w.Write(fatalMessage)
		}
		if act == CutAfter || act == FatalAfter {
			s.apply(act, w)
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// apply carries out a rule's action other than Pass. w holds what was
// forwarded before the message and is delivered first. A cut connection
// forwards nothing more in either direction from the moment of the cut:
// otherwise the peer could answer what w delivers, and its answer slip
// through before the sockets close.
func (s *session) apply(act Action, w *bufio.Writer) {
	if act != Blackhole {
		s.p.mu.Lock()
		s.cut = true
		s.p.mu.Unlock()
	}
	_ = w.Flush()
	if act != Blackhole {
		s.close()
	}
}

// decide asks the rule about m.
func (s *session) decide(m Message) Action {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if s.cut {
		return dropped
	}
	if s.partitioned {
		return discarded
	}
	if s.p.rule == nil {
		return Pass
	}
	act := s.p.rule(m)
	if act != Pass {
		s.p.cuts++
	}
	if act == Partition {
		// Set under the lock that orders every decision, so that the other
		// direction forwards nothing decided after this message.
		s.partitioned = true
	}
	return act
}

// describe decodes what rules look at, and tracks which statement each
// server answer belongs to.
func (s *session) describe(fromClient bool, typ byte, body []byte) Message {
	m := Message{Conn: s.id, FromClient: fromClient, Type: typ, Body: body}
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	if fromClient {
		switch typ {
		case 'Q':
			m.SQL = cstring(body, 0)
			s.pending = append(s.pending, pending{sql: m.SQL, simple: true})
		case 'P':
			name := cstring(body, 0)
			m.SQL = cstring(body, len(name)+1)
			s.stmts[name] = m.SQL
		case 'B':
			portal := cstring(body, 0)
			m.SQL = s.stmts[cstring(body, len(portal)+1)]
			s.portals[portal] = m.SQL
		case 'E':
			m.SQL = s.portals[cstring(body, 0)]
			s.pending = append(s.pending, pending{sql: m.SQL})
		case 'C': // Close: 'S'tatement or 'P'ortal
			if len(body) > 1 {
				if body[0] == 'S' {
					delete(s.stmts, cstring(body, 1))
				} else {
					delete(s.portals, cstring(body, 1))
				}
			}
		}
		return m
	}
	if len(s.pending) > 0 {
		m.SQL = s.pending[0].sql
	}
	switch typ {
	case 'C':
		m.Tag = cstring(body, 0)
		s.answered()
	case 'I', 's':
		s.answered()
	case 'E':
		// The server skips the rest of the pipeline up to Sync (or the
		// rest of a Query): nothing pending will be answered.
		m.SQLState = errorField(body, 'C')
		s.pending = s.pending[:0]
	case 'Z':
		if len(body) > 0 {
			m.TxStatus = body[0]
		}
		s.pending = s.pending[:0]
	}
	return m
}

// answered drops the oldest pending Execute, whose answer is complete. A
// Query stays until ReadyForQuery, as it may hold several statements.
func (s *session) answered() {
	if len(s.pending) > 0 && !s.pending[0].simple {
		s.pending = s.pending[1:]
	}
}

// cstring reads the NUL-terminated string at b[off:].
func cstring(b []byte, off int) string {
	if off >= len(b) {
		return ""
	}
	b = b[off:]
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// errorField returns field code of an ErrorResponse or NoticeResponse.
func errorField(b []byte, code byte) string {
	for len(b) > 0 && b[0] != 0 {
		f := b[0]
		v := cstring(b, 1)
		if f == code {
			return v
		}
		b = b[min(len(b), 1+len(v)+1):]
	}
	return ""
}

func abbreviate(sql string) string {
	sql = strings.Join(strings.Fields(StripComments(sql)), " ")
	if len(sql) > 40 {
		sql = sql[:40] + "…"
	}
	return sql
}
