package bench

import (
	"strings"
	"testing"
)

func TestRatio(t *testing.T) {
	tests := []struct {
		name string
		a, b float64
		want float64
	}{
		{"same cost", 40, 40, 1},
		{"slower", 45, 40, 1.125},
		{"faster", 30, 40, 0.75},
		{"a zero denominator is no ratio, not +Inf", 40, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ratio(tc.a, tc.b); got != tc.want {
				t.Errorf("ratio(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

// TestImageReportPrint: the table names both images and every contender
// (long names keep the columns aligned) and ends with the ratios and the
// paired differences, signed.
func TestImageReportPrint(t *testing.T) {
	r := &ImageReport{
		Image: "python@sha256:aa", VsImage: "imported-python@sha256:aa", Command: "python3 -c pass",
		Samples: []Sample{
			{Name: "moat-cli@python", MedianMS: 40, Command: "moat run --no-build --image python -- python3 -c pass"},
			{Name: "moat-cli@imported-python", MedianMS: 42, Command: "moat run --no-build --image imported-python -- python3 -c pass"},
			{Name: "moat-engine@python", MedianMS: 30},
			{Name: "moat-engine@imported-python", MedianMS: 30},
		},
		CLIRatio: 1.05, EngineRatio: 1, CLIDiffMS: 1.5, EngineDiffMS: -0.25,
	}
	var b strings.Builder
	r.Print(&b)
	out := b.String()
	for _, want := range []string{
		"image python@sha256:aa\nvs    imported-python@sha256:aa\n",
		"moat-engine@imported-python   30.00ms",
		"moat-cli@python               40.00ms",
		"vs / image (median): moat run 1.050, in-process engine 1.000",
		"moat run +1.50 ms, in-process engine -0.25 ms",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}
