package microvm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// fakeGuest is a sandbox whose "guest" is a fixed byte stream: what a
// hostile agent could send, without booting anything.
func fakeGuest(t *testing.T, stream []byte, maxOut int64) *Sandbox {
	t.Helper()
	ws := t.TempDir()
	return &Sandbox{
		m:    &MicroVM{opts: Options{MaxOutputBytes: maxOut}, vmm: &QEMU{}},
		spec: &tier.Spec{Limits: tier.Limits{WorkspaceBytes: 1 << 20, WorkspaceFiles: 10}},
		ws:   ws,
		vm:   &vm{r: bufio.NewReader(bytes.NewReader(stream)), exited: make(chan struct{}), socket: filepath.Join(ws, "none.sock")},
	}
}

func frame(typ byte, p []byte) []byte {
	var b bytes.Buffer
	vmwire.WriteFrame(&b, typ, p)
	return b.Bytes()
}

func tarOf(t *testing.T, entries ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return b.Bytes()
}

func TestHostileGuest(t *testing.T) {
	oversize := make([]byte, 5)
	oversize[0] = vmwire.FrameStdout
	binary.BigEndian.PutUint32(oversize[1:], vmwire.MaxFrame+1)
	big := bytes.Repeat([]byte("y"), 60<<10)
	var flood []byte
	for i := 0; i < 40; i++ {
		flood = append(flood, frame(vmwire.FrameStdout, big)...)
	}
	escape := tarOf(t, &tar.Header{Name: "../escaped", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644})
	tooMany := tarOf(t, func() []*tar.Header {
		var hs []*tar.Header
		for i := 0; i < 20; i++ {
			hs = append(hs, &tar.Header{Name: "f" + string(rune('a'+i)), Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
		}
		return hs
	}()...)
	throughLink := tarOf(t,
		&tar.Header{Name: "out", Typeflag: tar.TypeSymlink, Linkname: "/etc", Mode: 0o777},
		&tar.Header{Name: "out/moat-escaped", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	res := frame(vmwire.FrameResult, []byte(`{"exit_code":0}`))
	tests := []struct {
		name    string
		stream  []byte
		want    result.Termination
		wantErr string
	}{
		{"frame over the protocol's bound", oversize, result.InfraError, "larger than the protocol allows"},
		{"output flood", flood, result.OutputLimit, "more than"},
		{"unknown frame", frame('Z', nil), result.InfraError, "unknown frame"},
		{"silent after boot (channel closes)", nil, result.InfraError, "channel"},
		{"bad result JSON", frame(vmwire.FrameResult, []byte("{")), result.InfraError, "guest result"},
		{"agent failure message is sanitised", frame(vmwire.FrameFail, []byte("bad\x1b[2Jthing")), result.InfraError, "bad?[2Jthing"},
		{"tar entry escaping the workspace", append(append(frame(vmwire.FrameTar, escape), frame(vmwire.FrameTarEnd, nil)...), res...), result.InfraError, "outside the workspace"},
		{"tar through a symlink", append(append(frame(vmwire.FrameTar, throughLink), frame(vmwire.FrameTarEnd, nil)...), res...), result.InfraError, "workspace from the guest"},
		{"tar over the file limit", append(append(frame(vmwire.FrameTar, tooMany), frame(vmwire.FrameTarEnd, nil)...), res...), result.DiskLimit, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := fakeGuest(t, tc.stream, 1<<20)
			out, r, disk := s.collect(&tier.Command{Stdout: io.Discard, Stderr: io.Discard})
			term := result.Exited
			errText := ""
			if out != nil {
				term, errText = out.Termination, out.Error
			} else if disk {
				term = result.DiskLimit
			} else if r == nil {
				t.Fatal("no outcome and no result")
			}
			if term != tc.want || !strings.Contains(errText, tc.wantErr) {
				t.Errorf("termination %s error %q, want %s containing %q", term, errText, tc.want, tc.wantErr)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(s.ws), "escaped")); err == nil {
				t.Error("a file escaped the workspace")
			}
			if _, err := os.Lstat("/etc/moat-escaped"); err == nil {
				os.Remove("/etc/moat-escaped")
				t.Error("a file was written through a symlink")
			}
		})
	}
}

// TestAcceptedDegradations: the agent may only report going without
// Landlock, and only when the request accepted it.
func TestAcceptedDegradations(t *testing.T) {
	tests := []struct {
		name     string
		reported []string
		allow    bool
		want     string // the degradations, or the error
	}{
		{"none", nil, false, "[]"},
		{"landlock, accepted", []string{"landlock"}, true, "[landlock]"},
		{"landlock, not accepted", []string{"landlock"}, false, `error: reported unaccepted degradations "landlock"`},
		{"landlock twice", []string{"landlock", "landlock"}, true, `error: reported unaccepted degradations "landlock,landlock"`},
		{"another protection", []string{"seccomp"}, true, `error: reported unaccepted degradations "seccomp"`},
		{"control bytes are sanitised", []string{"x\x1b[2J"}, true, `error: reported unaccepted degradations "x?[2J"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := accepted(tc.reported, tc.allow)
			s := fmt.Sprint(got)
			if err != nil {
				s = "error: " + err.Error()
			}
			if s != tc.want {
				t.Errorf("accepted(%q, %v) = %s, want %s", tc.reported, tc.allow, s, tc.want)
			}
		})
	}
}

// TestPruneInitramfs: only the most recently used initramfs files stay
// (every agent build makes a new one), and nothing else in the cache goes.
func TestPruneInitramfs(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i := 0; i < 6; i++ {
		p := filepath.Join(dir, fmt.Sprintf("initramfs-%d.cpio", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, base.Add(time.Duration(i)*time.Minute), base.Add(time.Duration(i)*time.Minute))
	}
	os.WriteFile(filepath.Join(dir, "accel.json"), nil, 0o600)
	pruneInitramfs(dir, 4)
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	var names []string
	for _, p := range left {
		names = append(names, filepath.Base(p))
	}
	want := []string{"accel.json", "initramfs-2.cpio", "initramfs-3.cpio", "initramfs-4.cpio", "initramfs-5.cpio"}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("left %v, want %v", names, want)
	}
}
