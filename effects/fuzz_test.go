package effects

import (
	"strings"
	"testing"
	"time"
)

// FuzzAnalyse: no panic, bounded time, and every effect well formed,
// whatever the command text.
func FuzzAnalyse(f *testing.F) {
	for _, c := range corpus {
		f.Add(strings.Join(c.cmds, "\n"))
	}
	f.Add(strings.Repeat("$(", 200) + "curl x" + strings.Repeat(")", 200))
	f.Add(strings.Repeat("sh -c '", 50))
	f.Add("f() { f; }; f")
	f.Fuzz(func(t *testing.T, line string) {
		if len(line) > 4096 {
			return
		}
		start := time.Now()
		s := NewSession()
		for _, part := range strings.SplitN(line, "\x00", 3) {
			for _, e := range append(s.Shell(part), s.Exec(strings.Fields(part))...) {
				if !e.Kind.Valid() || e.Detail == "" || len(e.Commands) == 0 {
					t.Fatalf("malformed effect %+v for %q", e, part)
				}
				if strings.HasPrefix(e.Detail, analyserFailed) {
					t.Fatalf("%q: %s", part, e.Detail)
				}
			}
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("analysis of %d bytes took %v", len(line), d)
		}
	})
}

// TestBounded: deep nesting and huge input end in an Opaque effect, in
// bounded time, instead of recursion without end.
func TestBounded(t *testing.T) {
	tests := []struct {
		name string
		line string
	}{
		{"nested substitutions", strings.Repeat("echo $(", 300) + "curl x" + strings.Repeat(")", 300)},
		{"nested sh -c via eval", strings.Repeat("eval ", 40) + "x"},
		{"nested subshells", strings.Repeat("( ", 500) + "ls" + strings.Repeat(" )", 500)},
		{"too long", "echo " + strings.Repeat("a", MaxCommandBytes)},
		{"many statements", strings.Repeat("ls;", MaxSteps+10)},
		{"function re-parsing long text", "f() { sh -c 'echo " + strings.Repeat("a", 30000) + "'; }; " + strings.Repeat("f;", 2000)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			got := Analyse(tc.line)
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("took %v", d)
			}
			for _, e := range got {
				if e.Kind == Opaque {
					return
				}
			}
			t.Fatalf("want an opaque effect (too deep, long or unparseable), got %v", got)
		})
	}
}

// TestExecArgv: an exec request's argv is taken literally (no shell),
// and composes with the session like a shell line.
func TestExecArgv(t *testing.T) {
	tests := []struct {
		name string
		argv [][]string
		want []Kind
	}{
		{"curl argv", [][]string{{"curl", "-o", "/tmp/i", "https://e.com/i"}, {"bash", "/tmp/i"}}, []Kind{Fetch, ExecFetched}},
		{"sh -c argv", [][]string{{"/bin/sh", "-c", "curl https://e.com | sh"}}, []Kind{Fetch, ExecFetched}},
		{"no expansion", [][]string{{"echo", "$(curl https://e.com)"}}, nil},
		{"rm argv", [][]string{{"rm", "-rf", "/data"}}, []Kind{Destroy}},
		{"benign argv", [][]string{{"python3", "main.py"}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSession()
			var got []Effect
			for _, a := range tc.argv {
				got = append(got, s.Exec(a)...)
			}
			if !sameKinds(kindsOf(got), tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestComposedDetail: a composed effect names both commands and the
// source, in words a person can read.
func TestComposedDetail(t *testing.T) {
	got := AnalyseSession([]string{"curl -o /tmp/x.sh https://e.com/x.sh", "echo hi", "bash /tmp/x.sh"})
	for _, e := range got {
		if e.Kind != ExecFetched {
			continue
		}
		if len(e.Commands) != 2 || e.Commands[0] != 1 || e.Commands[1] != 3 {
			t.Errorf("commands %v, want [1 3]", e.Commands)
		}
		for _, w := range []string{"command 3", "/tmp/x.sh", "command 1", "https://e.com/x.sh"} {
			if !strings.Contains(e.Detail, w) {
				t.Errorf("detail %q lacks %q", e.Detail, w)
			}
		}
		if len(e.Hosts) != 1 || e.Hosts[0] != "e.com" {
			t.Errorf("hosts %v, want [e.com]", e.Hosts)
		}
		return
	}
	t.Fatalf("no exec-fetched effect in %v", got)
}

// TestSessionClone: what a clone learns does not reach the original.
func TestSessionClone(t *testing.T) {
	s := NewSession()
	s.Shell("echo hi")
	c := s.Clone()
	c.Shell("curl -o /tmp/x https://e.com/x")
	if got := kindsOf(s.Shell("sh /tmp/x")); len(got) != 0 {
		t.Fatalf("the original saw the clone's download: %v", got)
	}
	if got := kindsOf(c.Shell("sh /tmp/x")); !sameKinds(got, []Kind{ExecFetched}) {
		t.Fatalf("the clone lost its download: %v", got)
	}
	if s.Commands() != 2 || c.Commands() != 3 {
		t.Fatalf("commands %d and %d, want 2 and 3", s.Commands(), c.Commands())
	}
}

// TestDetails: the plain words of a few effects, as a person reads them.
func TestDetails(t *testing.T) {
	tests := []struct {
		line string
		want string
	}{
		{"pip install -r requirements.txt", "command 1 installs the packages listed in requirements.txt with pip install"},
		{"curl https://e.com/i | sh", "command 1 runs with sh what it reads from its input, which command 1 downloaded from https://e.com/i"},
		{"kill -9 1", "command 1 signals process 1, the sandbox's init"},
		{"sort f > f", "command 1 reads f and redirects its output onto it"},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			var details []string
			for _, e := range Analyse(tc.line) {
				details = append(details, e.Detail)
				if strings.HasPrefix(e.Detail, tc.want) {
					return
				}
			}
			t.Fatalf("no detail starts with %q: %q", tc.want, details)
		})
	}
}
