package microvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// TestRequestFreshness: every request carries its own 64 bytes of host
// entropy and the host's clock, which a restored guest needs (its RNG and
// clock are the snapshot's). The guest side (RNDADDENTROPY, RNDRESEEDCRNG,
// clock_settime, or a failed request) is exercised by TestSnapshot: a
// restored run that succeeds has applied them.
func TestRequestFreshness(t *testing.T) {
	var seen [][]byte
	for i := 0; i < 2; i++ {
		host, guest := net.Pipe()
		s := fakeGuest(t, nil, 1<<20)
		s.vm.conn, s.vm.r = host, bufio.NewReader(host)
		s.ready = make(chan struct{})
		close(s.ready)
		got := make(chan vmwire.Request, 1)
		go func() {
			r := bufio.NewReader(guest)
			var req vmwire.Request
			for {
				typ, p, err := vmwire.ReadFrame(r)
				if err != nil {
					return
				}
				if typ == vmwire.FrameRequest {
					json.Unmarshal(p, &req)
				}
				if typ == vmwire.FrameStdinEnd {
					break
				}
			}
			got <- req
			res, _ := json.Marshal(vmwire.Result{})
			vmwire.WriteFrame(guest, vmwire.FrameResult, res)
		}()
		before := time.Now()
		out, err := s.Exec(context.Background(), &tier.Command{Argv: []string{"true"}})
		if err != nil || out.Termination != result.Exited {
			t.Fatalf("exec: %v %+v", err, out)
		}
		req := <-got
		guest.Close()
		if len(req.Entropy) != 64 || bytes.Equal(req.Entropy, make([]byte, 64)) {
			t.Errorf("request %d entropy %x", i, req.Entropy)
		}
		if d := time.Unix(0, req.Time).Sub(before); d < 0 || d > time.Minute {
			t.Errorf("request %d time is %v after the call", i, d)
		}
		seen = append(seen, req.Entropy)
	}
	if bytes.Equal(seen[0], seen[1]) {
		t.Errorf("two requests carried the same entropy %x", seen[0])
	}
}
