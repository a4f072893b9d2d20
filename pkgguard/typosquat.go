package pkgguard

import (
	_ "embed"
	"strings"
)

//go:embed popular.txt
var popularText string

// popular holds the embedded popular names, by ecosystem, normalised.
var popular = func() map[Ecosystem][]string {
	m := map[Ecosystem][]string{}
	for _, line := range strings.Split(popularText, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || strings.HasPrefix(line, "#") {
			continue
		}
		eco := Ecosystem(f[0])
		m[eco] = append(m[eco], normalize(eco, f[1]))
	}
	return m
}()

func normalize(eco Ecosystem, name string) string {
	if eco == PyPI {
		return NormalizePyPI(name)
	}
	return strings.ToLower(name)
}

// IsPopular reports whether name (normalised) is on the embedded list of
// popular names of eco.
func IsPopular(eco Ecosystem, name string) bool {
	for _, p := range popular[eco] {
		if p == name {
			return true
		}
	}
	return false
}

// typoDistance is the largest edit distance at which a name counts as a
// likely typosquat of another: 2 in general ("reqeusts", "requestss"),
// 1 for names of four characters or fewer, where two edits reach too many
// unrelated names ("six" and "sip").
func typoDistance(name string) int {
	if len(name) <= 4 {
		return 1
	}
	return 2
}

// Resembles returns the name among candidates (normalised, not equal to
// name) that name is within the typosquat distance of, closest first,
// and whether there is one. Names that differ only in their separators
// are already equal after PEP 503 normalisation.
func Resembles(name string, candidates []string) (string, bool) {
	best, bestD := "", typoDistance(name)+1
	for _, c := range candidates {
		if c == name || abs(len(c)-len(name)) >= bestD {
			continue
		}
		if d := osaDistance(name, c, bestD); d < bestD && d <= typoDistance(c) {
			best, bestD = c, d
		}
	}
	return best, best != ""
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// osaDistance is the optimal-string-alignment Damerau-Levenshtein
// distance of a and b (insertions, deletions, substitutions and swaps of
// adjacent characters, each costing 1), or limit when it is limit or more.
// Names are bounded (214 bytes for npm), so the quadratic table is small.
func osaDistance(a, b string, limit int) int {
	if len(a) > 256 || len(b) > 256 {
		return limit
	}
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			v := min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				v = min(v, prev2[j-2]+1)
			}
			cur[j] = v
			rowMin = min(rowMin, v)
		}
		if rowMin >= limit {
			return limit
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return min(prev[len(b)], limit)
}
