package engines_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/engines"
	"github.com/moat-sandbox/moat/redteam"
)

// criEngine runs each red-team attack as the only container of a fresh
// pod with the handler, through crictl, as the kubelet would.
type criEngine struct {
	f       *fixture
	handler string
	prefix  string // of the pods' names, one per concurrent engine
	n       int
}

func (e *criEngine) RunContainer(ctx context.Context, argv []string, onStart func(func() ([]int, error))) (redteam.ContainerRun, error) {
	e.n++
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p, err := e.f.runPod(ctx, e.handler, fmt.Sprintf("redteam-%s%d", e.prefix, e.n), nil)
	if err != nil {
		return redteam.ContainerRun{}, err
	}
	defer p.remove(context.Background())
	// As on the native tier: the program as an unprivileged user (uid
	// and gid 1000, the native tier's sandbox user; in Kubernetes terms
	// runAsUser/runAsGroup), the image read-only and a writable
	// /workspace (readOnlyRootFilesystem and a volume: a directory of
	// the pod's, bound in).
	ws := filepath.Join(p.dir, "workspace")
	if err := os.Mkdir(ws, 0o777); err != nil {
		return redteam.ContainerRun{}, err
	}
	os.Chmod(ws, 0o777) // the container's ids are not the host's
	extra := map[string]any{
		"linux": map[string]any{"security_context": map[string]any{
			"readonly_rootfs": true,
			"run_as_user":     map[string]any{"value": 1000},
			"run_as_group":    map[string]any{"value": 1000},
		}},
		"mounts": []map[string]any{{"container_path": "/workspace", "host_path": ws}},
	}
	id, err := p.start(ctx, "attack", argv, extra)
	if err != nil {
		// The CRI's message (the runtime's refusal) is at the end.
		msg := err.Error()
		if ce, ok := err.(*engines.CmdError); ok {
			msg = lastLines(ce.Stderr, 1)
		}
		return redteam.ContainerRun{}, fmt.Errorf("crictl start: %s", msg)
	}
	list, release := pidNamespaceLister(ctx, p, e.handler, id)
	defer release()
	onStart(list)
	// The corpus's programs end by themselves; one that does not within
	// a minute is stopped, and its exit status says so (137).
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	code, err := p.wait(wctx, id)
	wcancel()
	if err != nil {
		if _, serr := e.f.cd.Crictl(ctx, "stop", "--timeout", "1", id); serr != nil {
			return redteam.ContainerRun{}, err
		}
		if code, err = p.wait(ctx, id); err != nil {
			return redteam.ContainerRun{}, err
		}
	}
	out, err := p.logs(ctx, id)
	if err != nil {
		return redteam.ContainerRun{}, err
	}
	return redteam.ContainerRun{Output: out, ExitCode: code}, nil
}

// pidNamespaceLister lists the host pids in the container's PID
// namespace (the container's init as the CRI reports it, and everything
// it started), read from the host's /proc. It holds the namespace open
// until release: the kernel hands a freed namespace's inode number to
// the next namespace made anywhere (the lowest free one), so a name read
// once would, after the container ends, match the namespace of another
// pod's init still being created (host root until it takes its ids) and
// judge that as this container's.
func pidNamespaceLister(ctx context.Context, p *pod, handler, id string) (list func() ([]int, error), release func()) {
	var info struct {
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	var err error
	// The runtime's own state first: a file read, where crictl inspect
	// takes a few hundred milliseconds, in which a short attack may end
	// before the host has looked at it.
	if info.Info.Pid = runtimePid(p, handler, id); info.Info.Pid == 0 {
		var out string
		out, err = p.f.cd.Crictl(ctx, "inspect", "-o", "json", id)
		if err == nil {
			err = json.Unmarshal([]byte(out), &info)
		}
	}
	var (
		mu   sync.Mutex
		pin  *os.File // the namespace, held open; nil: exited before the host could look
		name string   // its "pid:[inode]", unique while pin is open
	)
	if err == nil && info.Info.Pid > 0 {
		if f, oerr := os.Open(fmt.Sprintf("/proc/%d/ns/pid", info.Info.Pid)); oerr == nil {
			if l, lerr := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd())); lerr == nil {
				pin, name = f, l
			} else {
				f.Close()
			}
		}
	}
	release = func() {
		mu.Lock()
		defer mu.Unlock()
		if pin != nil {
			pin.Close()
			pin = nil
		}
	}
	list = func() ([]int, error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("crictl inspect %s: %w", id, err)
		}
		if pin == nil {
			return nil, nil
		}
		// Names, as readlink gives them: cheap enough to read for every
		// process each few milliseconds, and unambiguous while pinned.
		if self, _ := os.Readlink("/proc/self/ns/pid"); self == name {
			return nil, fmt.Errorf("container %s shares the host's PID namespace", id)
		}
		ents, _ := os.ReadDir("/proc")
		var pids []int
		for _, e := range ents {
			pid, perr := strconv.Atoi(e.Name())
			if perr != nil {
				continue
			}
			if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l == name {
				pids = append(pids, pid)
			}
		}
		return pids, nil
	}
	return list, release
}

// runtimePid reads the container's init pid from the handler's runtime
// state under containerd's runtime root (moat-runtime's state.json "pid",
// runc's "init_process_pid"); 0 when it cannot.
func runtimePid(p *pod, handler, id string) int {
	matches, _ := filepath.Glob(filepath.Join(p.f.cd.Dir, "runtime-"+handler, "*", id, "state.json"))
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		var st struct {
			Pid     int `json:"pid"`
			InitPid int `json:"init_process_pid"`
		}
		if json.Unmarshal(b, &st) == nil {
			if st.Pid > 0 {
				return st.Pid
			}
			if st.InitPid > 0 {
				return st.InitPid
			}
		}
	}
	return 0
}

// TestRedTeamCRI runs the red-team corpus through containerd's CRI with
// Moat's runtime as the pod's handler: every case a container can carry,
// each as the only container of its own pod, judged from the host. Moat
// must contain every one (no escape, no error; not-applicable cases say
// why). runc, the engine's default, runs the same cases first as the
// peer on a few cases: judged by Moat's standard (an unprivileged host
// uid, no capabilities, seccomp, refused mounts and namespaces) it
// escapes each, which proves that the path through the engine can see an
// escape (on the whole corpus it escapes 30 of the 41 cases that apply).
func TestRedTeamCRI(t *testing.T) {
	f := getFixture(t)
	cases, err := redteam.Cases()
	if err != nil {
		t.Fatal(err)
	}
	// MOAT_ENGINES_CASES=id,id narrows the corpus for a manual run.
	if only := os.Getenv("MOAT_ENGINES_CASES"); only != "" {
		var sel []redteam.Case
		for _, c := range cases {
			if slices.Contains(strings.Split(only, ","), c.ID) {
				sel = append(sel, c)
			}
		}
		cases = sel
	}
	// runc, the peer, runs only cases it is known to fail by Moat's
	// standard (root on the host, capabilities, no seccomp): enough to
	// show that the path through the engine sees an escape, in seconds.
	peer := []string{"det-host-pid", "fs-mknod", "priv-unshare-user", "sc-io-uring"}
	tests := []struct {
		handler    string
		only       []string // cases, or all
		minEscaped int      // at least this many escapes
		maxEscaped int      // at most
	}{
		{handler: "runc", only: peer, minEscaped: len(peer), maxEscaped: len(peer)},
		{handler: "moat", minEscaped: 0, maxEscaped: 0},
	}
	for _, tc := range tests {
		t.Run(tc.handler, func(t *testing.T) {
			f.needMoat(t, tc.handler)
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			sel := cases
			if tc.only != nil {
				sel = slices.DeleteFunc(slices.Clone(cases), func(c redteam.Case) bool { return !slices.Contains(tc.only, c.ID) })
			}
			// Four pods at a time: most of a case's time is the native
			// snapshotter copying the python image.
			const workers = 4
			chunks := make([][]redteam.Verdict, workers)
			var wg sync.WaitGroup
			for w := range workers {
				var part []redteam.Case
				for i := w; i < len(sel); i += workers {
					part = append(part, sel[i])
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					chunks[w] = redteam.RunContainers(ctx, &criEngine{f: f, handler: tc.handler, prefix: fmt.Sprintf("w%d-", w)}, "cri-"+tc.handler, part)
				}()
			}
			wg.Wait()
			vs := slices.Concat(chunks...)
			escaped := 0
			for _, v := range vs {
				switch v.Verdict {
				case redteam.Error:
					t.Errorf("%s error on %s: %s", v.Case, v.Tier, v.Evidence)
				case redteam.Escaped:
					escaped++
					if tc.maxEscaped == 0 {
						t.Errorf("%s ESCAPED on %s: %s", v.Case, v.Tier, v.Evidence)
					}
				case redteam.Contained:
					t.Logf("%s contained (%.1f s): %s", v.Case, v.Seconds, v.Evidence)
				}
			}
			t.Logf("red team through containerd/CRI, handler %s: %s", tc.handler, redteam.ContainerSummary(vs))
			if escaped < tc.minEscaped || escaped > tc.maxEscaped {
				t.Errorf("handler %s: %d escapes, want %d to %d", tc.handler, escaped, tc.minEscaped, tc.maxEscaped)
			}
		})
	}
}
