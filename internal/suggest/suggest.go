// Package suggest finds the name a user probably meant, for "did you mean"
// hints: the CLI's unknown commands and the manifest's unknown keys. It is
// the one owner of Moat's edit distance, so the two hints cannot drift
// apart. It must never decide anything but a hint: a suggestion is never
// applied in place of what the user wrote.
package suggest

// MaxDistance is the most edits a word may be from a name for Closest to
// suggest the name: beyond two, a "did you mean" guesses more than it
// corrects.
const MaxDistance = 2

// EditDistance is the number of edits that turn a into b: inserting,
// deleting or replacing one byte, or swapping two adjacent bytes ("rnu" ->
// "run", "memroy" -> "memory"), each counts as one (the optimal string
// alignment distance: a swapped pair is not edited again). It compares
// bytes, which is enough for the ASCII names Moat suggests.
func EditDistance(a, b string) int {
	// d[i][j] is the distance between a[:i] and b[:j].
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// Closest returns the candidate fewest edits from word, at most
// MaxDistance, and whether there is one. On a tie the earlier candidate
// wins, so the caller's order decides. A candidate whose length differs
// from word's by more than MaxDistance is skipped unmeasured (it cannot be
// close enough), which keeps a very long word cheap.
func Closest(word string, candidates []string) (string, bool) {
	best, bestDist := "", MaxDistance+1
	for _, c := range candidates {
		if diff := len(word) - len(c); diff > MaxDistance || -diff > MaxDistance {
			continue
		}
		if d := EditDistance(word, c); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best, bestDist <= MaxDistance
}
