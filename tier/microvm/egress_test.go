package microvm

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/internal/guestkernel"
)

// TestQEMUArgsEgress: the egress port exists only with an egress grant,
// as a virtio-serial port (never a network device), and the snapshot key
// masks its per-run path but not its presence.
func TestQEMUArgsEgress(t *testing.T) {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	q := &QEMU{Binary: file("qemu")}
	m := &MicroVM{vmm: q, digests: map[string]digestEntry{}}
	kernel, initrd, disk := file("vmlinuz"), file("initrd"), file("disk")
	cfg := func(run string, egress bool) *VMConfig {
		rd := "/runs/" + run + "/microvm/run"
		c := &VMConfig{Kernel: kernel, Initramfs: initrd, RootDisk: disk, Cmdline: guestkernel.Cmdline(false), RunDir: rd,
			Socket: rd + "/agent.sock", MemoryMiB: 704, VCPUs: 1, Accel: "tcg"}
		if egress {
			c.Egress, c.EgressProxy = rd+"/egress.sock", "/runs/"+run+"/egress.sock"
		}
		return c
	}
	for _, tc := range []struct {
		name   string
		cfg    *VMConfig
		want   []string
		absent []string
	}{
		{"no grant: one port", cfg("a", false),
			[]string{"virtio-serial-device,max_ports=2", "virtserialport,chardev=agent,name=moat"},
			[]string{vmwire.EgressPortName, "egress", "max_ports=3"}},
		{"grant: a second port to the egress socket", cfg("a", true),
			[]string{"virtio-serial-device,max_ports=3", "virtserialport,chardev=agent,name=moat",
				// The jail's view of the run directory (jailRunDir).
				"socket,id=egress,path=" + jailRunDir + "/egress.sock,server=on,wait=off",
				"virtserialport,chardev=egress,name=" + vmwire.EgressPortName},
			[]string{"/runs/a/egress.sock", "/runs/a/microvm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := strings.Join(q.Args(tc.cfg), "\n") + "\n"
			for _, w := range tc.want {
				if !strings.Contains(args, w+"\n") {
					t.Errorf("args lack %q:\n%s", w, args)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(args, a) {
					t.Errorf("args contain %q:\n%s", a, args)
				}
			}
			// Never a network device, with or without the grant.
			for _, a := range []string{"-netdev", "-nic", "-net\n", "virtio-net", "vhost", "vsock"} {
				if strings.Contains(args, a) {
					t.Errorf("args contain %q:\n%s", a, args)
				}
			}
		})
	}
	key := func(c *VMConfig) string {
		k, why := m.snapshotKey(c)
		if k == "" {
			t.Fatalf("no snapshot key: %s", why)
		}
		return k
	}
	if key(cfg("a", true)) != key(cfg("b", true)) {
		t.Error("the snapshot key depends on the run's egress socket path")
	}
	if key(cfg("a", false)) != key(cfg("b", false)) {
		t.Error("the snapshot key depends on the run's agent socket path")
	}
	if key(cfg("a", true)) == key(cfg("a", false)) {
		t.Error("a VM with the egress port has the same snapshot key as one without")
	}
}

// socketPair is the two ends of the egress port's socket: the host's and
// the (fake) guest's, with real kernel buffers so a side that stops
// reading blocks the other's writes.
func socketPair(t *testing.T) (host, guest net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "egress-port")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// fakeProxy stands for the egress proxy: each connection is served by
// serve; it counts connections at once and bytes it wrote.
type fakeProxy struct {
	path              string
	l                 net.Listener
	now, most, served atomic.Int64
	wrote             atomic.Int64
	wg                sync.WaitGroup
	mu                sync.Mutex
	conns             []net.Conn
	done              chan struct{}
}

func newFakeProxy(t *testing.T, serve func(p *fakeProxy, c net.Conn)) *fakeProxy {
	t.Helper()
	p := &fakeProxy{path: filepath.Join(t.TempDir(), "proxy.sock"), done: make(chan struct{})}
	l, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.l = l
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.served.Add(1)
			n := p.now.Add(1)
			for {
				m := p.most.Load()
				if n <= m || p.most.CompareAndSwap(m, n) {
					break
				}
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.now.Add(-1)
				defer c.Close()
				serve(p, c)
			}()
		}
	}()
	return p
}

func (p *fakeProxy) close() {
	close(p.done)
	p.l.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// echo reads the whole request, then answers with it and closes.
func echo(p *fakeProxy, c net.Conn) {
	b, _ := io.ReadAll(c)
	n, _ := c.Write(append([]byte("echo:"), b...))
	p.wrote.Add(int64(n))
}

// hold keeps the connection open, reading, until it is closed.
func hold(p *fakeProxy, c net.Conn) { io.Copy(io.Discard, c) }

// stall neither reads nor writes until the proxy is closed.
func stall(p *fakeProxy, c net.Conn) { <-p.done }

// flood writes to the connection until it fails.
func flood(p *fakeProxy, c net.Conn) {
	buf := bytes.Repeat([]byte("x"), 32<<10)
	for {
		n, err := c.Write(buf)
		p.wrote.Add(int64(n))
		if err != nil {
			return
		}
	}
}

// yamuxFrame is one raw frame as a hostile guest can write it.
func yamuxFrame(typ byte, flags uint16, id, length uint32, body []byte) []byte {
	h := make([]byte, yamuxHeader, yamuxHeader+len(body))
	h[1] = typ
	binary.BigEndian.PutUint16(h[2:], flags)
	binary.BigEndian.PutUint32(h[4:], id)
	binary.BigEndian.PutUint32(h[8:], length)
	return append(h, body...)
}

// settled waits until the goroutine count is back to base, and fails
// naming what is left otherwise.
func settled(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%d goroutines left, %d before:\n%s", runtime.NumGoroutine(), base, buf[:n])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// within fails unless f returns within d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestEgressRelay: a well-behaved guest's stream reaches the proxy and
// back, with half-closes passed along both ways.
func TestEgressRelay(t *testing.T) {
	base := runtime.NumGoroutine()
	p := newFakeProxy(t, echo)
	host, guest := socketPair(t)
	ch, err := newEgressChannel(host, p.path, vmwire.EgressMaxConns)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := yamux.Client(guest, vmwire.EgressConfig())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		st, err := cl.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		st.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		st.Close() // half-close: the proxy sees EOF and answers
		st.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(st)
		if err != nil || string(b) != "echo:GET / HTTP/1.1\r\n\r\n" {
			t.Fatalf("stream %d: %q, %v", i, b, err)
		}
	}
	cl.Close()
	within(t, 5*time.Second, "Close", ch.Close)
	p.close()
	settled(t, base)
}

// TestEgressHostileGuest: whatever the guest sends on the egress port, the
// host relays at most the limit of streams at once, holds a bounded
// number of streams, breaks only this session on protocol garbage, and
// its Close (the VM's kill: Exec's end, Destroy) returns at once and
// leaves no goroutine behind.
func TestEgressHostileGuest(t *testing.T) {
	const limit = 8
	tests := []struct {
		name  string
		proxy func(*fakeProxy, net.Conn)
		guest func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy)
	}{
		{"garbage instead of frames", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			g.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
			wantBroken(t, ch)
		}},
		{"a ping (yamux would answer it in a new goroutine)", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			for i := 0; i < 1000; i++ {
				g.Write(yamuxFrame(yamuxPing, yamuxSYN, 0, uint32(i), nil))
			}
			wantBroken(t, ch)
		}},
		{"a data frame larger than a window", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			g.Write(yamuxFrame(yamuxData, yamuxSYN, 1, 1<<30, nil))
			wantBroken(t, ch)
		}},
		{"more data than the windows granted", stall, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			// The proxy reads nothing, so the host can grant at most one
			// window plus what the socket to the proxy absorbs.
			chunk := bytes.Repeat([]byte("d"), vmwire.EgressWindow)
			g.Write(yamuxFrame(yamuxData, yamuxSYN, 1, uint32(len(chunk)), chunk))
			for i := 0; i < 15; i++ {
				if _, err := g.Write(yamuxFrame(yamuxData, 0, 1, uint32(len(chunk)), chunk)); err != nil {
					break
				}
			}
			wantBroken(t, ch)
		}},
		{"a stream id the host would use", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			g.Write(yamuxFrame(yamuxWindowUpdate, yamuxSYN, 2, 0, nil))
			wantBroken(t, ch)
		}},
		{"a stream id declared twice while open", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			g.Write(yamuxFrame(yamuxWindowUpdate, yamuxSYN, 5, 0, nil))
			g.Write(yamuxFrame(yamuxWindowUpdate, yamuxSYN, 5, 0, nil))
			wantBroken(t, ch)
		}},
		{"unknown flags", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			g.Write(yamuxFrame(yamuxWindowUpdate, 0x10|yamuxSYN, 1, 0, nil))
			wantBroken(t, ch)
		}},
		{"a stream flood far past the limit", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			// Raw SYNs, each with a little data, never closed, and the
			// port never read: more open streams than any agent keeps
			// break the session.
			go io.Copy(io.Discard, g)
			for id := uint32(1); id < 2*5000; id += 2 {
				if _, err := g.Write(yamuxFrame(yamuxData, yamuxSYN, id, 4, []byte("ping"))); err != nil {
					break
				}
			}
			wantBroken(t, ch)
			if m := p.most.Load(); m > limit {
				t.Errorf("%d proxy connections at once, limit %d", m, limit)
			}
		}},
		{"a yamux client keeping more streams open than the limit", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			cfg := vmwire.EgressConfig()
			cfg.AcceptBacklog = 4096 // a hostile guest ignores the shared backlog
			cl, err := yamux.Client(g, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for i := 0; i < 200; i++ {
				st, err := cl.OpenStream()
				if err != nil {
					break
				}
				st.Write([]byte("x"))
				if n := ch.sess.NumStreams(); n > 2*limit+vmwire.EgressBacklog {
					t.Errorf("the host holds %d streams, more than limit+backlog+limit %d", n, 2*limit+vmwire.EgressBacklog)
				}
			}
			wantBroken(t, ch)
			if m := p.most.Load(); m > limit {
				t.Errorf("%d proxy connections at once, limit %d", m, limit)
			}
		}},
		{"SYNs out of order, as concurrent opens send them, are fine", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			go io.Copy(io.Discard, g)
			for _, id := range []uint32{3, 1, 7, 5} {
				g.Write(yamuxFrame(yamuxWindowUpdate, yamuxSYN, id, 0, nil))
			}
			for wait := time.Now().Add(2 * time.Second); p.served.Load() < 4 && time.Now().Before(wait); {
				time.Sleep(10 * time.Millisecond)
			}
			if ch.broken() || p.served.Load() != 4 {
				t.Errorf("session broken %v, %d of 4 streams relayed", ch.broken(), p.served.Load())
			}
		}},
		{"streams over the limit end at once; the session recovers", hold, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			// What the agent does under a connection flood: more streams
			// than the host relays (its relay and the host's drain at
			// different moments), each closed by the guest when its
			// program gives up. None may wait for a slot, and once they
			// are closed a new one is relayed.
			cl, err := yamux.Client(g, vmwire.EgressConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			var sts []*yamux.Stream
			for i := 0; i < limit+vmwire.EgressBacklog; i++ {
				st, err := cl.OpenStream()
				if err != nil {
					t.Fatal(err)
				}
				st.Write([]byte("x"))
				sts = append(sts, st)
			}
			// Every one over the limit reads EOF promptly.
			ended := 0
			for _, st := range sts[limit:] {
				st.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := st.Read(make([]byte, 1)); err == io.EOF {
					ended++
				}
			}
			if ended != vmwire.EgressBacklog {
				t.Errorf("%d of %d streams over the limit were closed at once", ended, vmwire.EgressBacklog)
			}
			for wait := time.Now().Add(2 * time.Second); p.most.Load() < limit && time.Now().Before(wait); {
				time.Sleep(10 * time.Millisecond) // the relays dial the proxy
			}
			if m := p.most.Load(); m != limit {
				t.Errorf("%d proxy connections at once, want the limit %d", m, limit)
			}
			// The guest gives them all up; the relays end with their
			// proxy connections, and the next stream is relayed.
			for _, st := range sts {
				st.Close()
			}
			deadline := time.Now().Add(3 * time.Second)
			for p.now.Load() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			st, err := cl.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			st.Write([]byte("again"))
			// Its own deadline: on a loaded machine the wait above can
			// use up most of its 3 s before this stream is opened.
			for deadline := time.Now().Add(10 * time.Second); p.served.Load() == limit && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			if ch.broken() || p.served.Load() != limit+1 {
				t.Errorf("after the flood: session broken %v, %d streams relayed in all, want %d", ch.broken(), p.served.Load(), limit+1)
			}
			st.Close()
		}},
		{"a stream that never reads while the proxy floods it", flood, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			cl, err := yamux.Client(g, vmwire.EgressConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			for i := 0; i < limit; i++ {
				st, err := cl.OpenStream()
				if err != nil {
					t.Fatal(err)
				}
				st.Write([]byte("GET /big HTTP/1.1\r\n\r\n"))
			}
			time.Sleep(time.Second)
			// Per stream: one window in the guest, the relay's copy
			// buffer, and the socket buffers between proxy and host.
			if w := p.wrote.Load(); w > limit*(vmwire.EgressWindow+2<<20) {
				t.Errorf("the proxy could write %d bytes into streams nobody reads", w)
			}
		}},
		{"the port never read at all", flood, func(t *testing.T, g net.Conn, ch *egressChannel, p *fakeProxy) {
			for id := uint32(1); id < 2*limit; id += 2 {
				g.Write(yamuxFrame(yamuxData, yamuxSYN, id, 3, []byte("GET")))
			}
			time.Sleep(time.Second)
			if w := p.wrote.Load(); w > limit*(vmwire.EgressWindow+2<<20) {
				t.Errorf("the proxy could write %d bytes towards a guest that reads nothing", w)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			p := newFakeProxy(t, tc.proxy)
			host, guest := socketPair(t)
			ch, err := newEgressChannel(host, p.path, limit)
			if err != nil {
				t.Fatal(err)
			}
			// The VM's kill is what ends the channel in the tier.
			v := &vm{exited: make(chan struct{}), egress: ch}
			tc.guest(t, guest, ch, p)
			within(t, 5*time.Second, "the VM's kill", v.kill)
			guest.Close()
			p.close()
			settled(t, base)
		})
	}
}

func wantBroken(t *testing.T, ch *egressChannel) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ch.broken() {
		if time.Now().After(deadline) {
			t.Fatal("the session survived the guest's protocol violation")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
