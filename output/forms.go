package output

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// EncodedForms are the byte strings whose presence shows that p was
// written out: p itself, its hex (both cases) and, for base64 and
// base64url, the part of the encoding that does not depend on where p
// starts in the encoded input (three alignments) nor on what follows it;
// a base64 part shorter than min is left out, since it would match
// ordinary bytes by chance.
//
// It is the one owner of "what counts as an encoded token": the egress
// proxy uses it for secrets' placeholders and canaries in requests, the
// output guard for canaries in output and files.
func EncodedForms(p []byte, min int) [][]byte {
	forms := [][]byte{p, []byte(hex.EncodeToString(p)), []byte(strings.ToUpper(hex.EncodeToString(p)))}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for pad := 0; pad < 3; pad++ {
			in := append(bytes.Repeat([]byte{0}, pad), p...)
			e := enc.EncodeToString(in)
			// The first ceil(pad*8/6) characters carry the padding
			// bytes; the last group may carry what follows p.
			start := (pad*8 + 5) / 6
			end := (len(in) / 3) * 4
			if end-start >= min {
				forms = append(forms, []byte(e[start:end]))
			}
		}
	}
	return forms
}
