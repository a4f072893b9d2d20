package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/bench"
)

// TestBenchImageFlags checks what moat bench --image and --vs-image refuse
// before anything is measured: a name the store does not hold is named
// together with the images it does hold, and the two comparisons (another
// image, another binary) are not mixed.
func TestBenchImageFlags(t *testing.T) {
	needRoot(t)
	home := t.TempDir()
	env := []string{"MOAT_HOME=" + home}
	tests := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{"unknown --image", []string{"bench", "--image", "nosuch", "--runs", "1"},
			[]string{"--image nosuch", `image "nosuch"`, "known images:", "python"}},
		{"unknown --vs-image", []string{"bench", "--image", "python", "--vs-image", "nosuch-either", "--runs", "1"},
			// The store in home is empty: python is the first flag's
			// image, looked up first, and not built there.
			[]string{"--image python", "moat image build python"}},
		{"--vs-image with --against", []string{"bench", "--vs-image", "python", "--against", "/bin/true"},
			[]string{"--vs-image and --against are two different comparisons"}},
		{"a command without --vs-image", []string{"bench", "--runs", "1", "--", "node", "-e", "0"},
			[]string{"is for --vs-image only"}},
		{"a command without --", []string{"bench", "--vs-image", "python", "true"},
			[]string{`unexpected argument "true"`, "goes after --"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			moat(t, invocation{args: tc.args, env: env}).check(t, exitUsage, nil, tc.wantErr, nil)
		})
	}
	t.Run("unknown --vs-image beside a stored --image", func(t *testing.T) {
		needImage(t)
		moat(t, invocation{args: []string{"bench", "--image", "python", "--vs-image", "nosuch", "--runs", "1"}}).
			check(t, exitUsage, nil, []string{"--vs-image nosuch", `image "nosuch"`, "known images:", "python"}, nil)
	})
}

// TestBenchVsImage runs moat bench --vs-image with small counts on the
// python image against itself (the comparison's mechanics; the figure for
// an imported image is scripts/test's and docs/BENCHMARKS.md's): four
// contenders, each timed --runs times, and ratios that are medians over
// medians.
func TestBenchVsImage(t *testing.T) {
	needSandbox(t)
	tests := []struct {
		name    string
		command []string
		want    string // Command in the report
	}{
		{"default command", nil, "python3 -c pass"},
		// Its -c is the command's, not a flag of moat bench.
		{"given command", []string{"--", "sh", "-c", "true"}, "sh -c true"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"bench", "--image", "python", "--vs-image", "python", "--runs", "3", "--json"}, tc.command...)
			o := moat(t, invocation{args: args})
			if o.code != 0 {
				t.Fatalf("moat %q\n%s", args, o)
			}
			var rep bench.ImageReport
			dec := json.NewDecoder(strings.NewReader(o.stdout))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rep); err != nil {
				t.Fatalf("decode the report: %v\n%s", err, o)
			}
			if rep.Command != tc.want {
				t.Errorf("command %q, want %q", rep.Command, tc.want)
			}
			if !strings.HasPrefix(rep.Image, "python@sha256:") || rep.VsImage != rep.Image {
				t.Errorf("images %q and %q, want python@sha256:... twice", rep.Image, rep.VsImage)
			}
			wantNames := []string{"moat-cli@python", "moat-cli@python", "moat-engine@python", "moat-engine@python"}
			if len(rep.Samples) != len(wantNames) {
				t.Fatalf("%d samples, want %d\n%s", len(rep.Samples), len(wantNames), o)
			}
			for i, s := range rep.Samples {
				if s.Name != wantNames[i] || s.Runs != 3 || s.MedianMS <= 0 {
					t.Errorf("sample %d: %+v, want %s with 3 runs and a positive median", i, s, wantNames[i])
				}
			}
			for _, r := range []struct {
				what      string
				got       float64
				vs, image float64
			}{
				{"cli ratio", rep.CLIRatio, rep.Samples[1].MedianMS, rep.Samples[0].MedianMS},
				{"engine ratio", rep.EngineRatio, rep.Samples[3].MedianMS, rep.Samples[2].MedianMS},
			} {
				if want := r.vs / r.image; r.got != want {
					t.Errorf("%s %v, want %v (vs median over image median)", r.what, r.got, want)
				}
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		o := moat(t, invocation{args: []string{"bench", "--image", "python", "--vs-image", "python", "--runs", "2"}})
		o.check(t, 0, []string{"vs / image (median): moat run ", "paired difference", "moat-engine@python"}, nil, nil)
	})
}
