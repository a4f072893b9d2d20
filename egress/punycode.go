package egress

import (
	"errors"
	"math"
	"strings"
)

// Punycode (RFC 3492), written here because golang.org/x/net/idna needs
// golang.org/x/text, which this module does not carry. Only the bootstring
// algorithm is implemented; the name policy around it is in normaliseHost.

const (
	pcBase        = 36
	pcTMin        = 1
	pcTMax        = 26
	pcSkew        = 38
	pcDamp        = 700
	pcInitialBias = 72
	pcInitialN    = 128
)

var errPunycode = errors.New("invalid punycode")

func pcAdapt(delta, numPoints int, first bool) int {
	if first {
		delta /= pcDamp
	} else {
		delta /= 2
	}
	delta += delta / numPoints
	k := 0
	for delta > ((pcBase-pcTMin)*pcTMax)/2 {
		delta /= pcBase - pcTMin
		k += pcBase
	}
	return k + (pcBase-pcTMin+1)*delta/(delta+pcSkew)
}

func pcThreshold(k, bias int) int {
	switch {
	case k <= bias:
		return pcTMin
	case k >= bias+pcTMax:
		return pcTMax
	}
	return k - bias
}

func pcDigit(d int) byte {
	if d < 26 {
		return byte('a' + d)
	}
	return byte('0' + d - 26)
}

func pcValue(c byte) (int, bool) {
	switch {
	case c >= 'a' && c <= 'z':
		return int(c - 'a'), true
	case c >= 'A' && c <= 'Z':
		return int(c - 'A'), true
	case c >= '0' && c <= '9':
		return int(c-'0') + 26, true
	}
	return 0, false
}

// punyEncode encodes a label's code points (without the "xn--" prefix).
func punyEncode(label []rune) (string, error) {
	var out strings.Builder
	basic := 0
	for _, r := range label {
		if r < 0x80 {
			out.WriteByte(byte(r))
			basic++
		}
	}
	if basic > 0 {
		out.WriteByte('-')
	}
	n, delta, bias := pcInitialN, 0, pcInitialBias
	for h := basic; h < len(label); {
		m := math.MaxInt32
		for _, r := range label {
			if int(r) >= n && int(r) < m {
				m = int(r)
			}
		}
		if (m - n) > (math.MaxInt32-delta)/(h+1) {
			return "", errPunycode
		}
		delta += (m - n) * (h + 1)
		n = m
		for _, r := range label {
			if int(r) < n {
				delta++
				if delta == math.MaxInt32 {
					return "", errPunycode
				}
			}
			if int(r) != n {
				continue
			}
			q := delta
			for k := pcBase; ; k += pcBase {
				t := pcThreshold(k, bias)
				if q < t {
					break
				}
				out.WriteByte(pcDigit(t + (q-t)%(pcBase-t)))
				q = (q - t) / (pcBase - t)
			}
			out.WriteByte(pcDigit(q))
			bias = pcAdapt(delta, h+1, h == basic)
			delta = 0
			h++
		}
		delta++
		n++
	}
	return out.String(), nil
}

// punyDecode decodes a label (without the "xn--" prefix). Its input is
// bounded by the caller (a DNS label, at most 63 bytes).
func punyDecode(s string) ([]rune, error) {
	var out []rune
	rest := s
	if i := strings.LastIndexByte(s, '-'); i >= 0 {
		for j := 0; j < i; j++ {
			if s[j] >= 0x80 {
				return nil, errPunycode
			}
			out = append(out, rune(s[j]))
		}
		rest = s[i+1:]
	}
	n, i, bias := pcInitialN, 0, pcInitialBias
	for pos := 0; pos < len(rest); {
		oldi, w := i, 1
		for k := pcBase; ; k += pcBase {
			if pos >= len(rest) {
				return nil, errPunycode
			}
			d, ok := pcValue(rest[pos])
			pos++
			if !ok || d > (math.MaxInt32-i)/w {
				return nil, errPunycode
			}
			i += d * w
			t := pcThreshold(k, bias)
			if d < t {
				break
			}
			if w > math.MaxInt32/(pcBase-t) {
				return nil, errPunycode
			}
			w *= pcBase - t
		}
		size := len(out) + 1
		bias = pcAdapt(i-oldi, size, oldi == 0)
		if i/size > math.MaxInt32-n {
			return nil, errPunycode
		}
		n += i / size
		i %= size
		if n > 0x10FFFF || (n >= 0xD800 && n <= 0xDFFF) || n < 0x80 {
			return nil, errPunycode
		}
		out = append(out, 0)
		copy(out[i+1:], out[i:])
		out[i] = rune(n)
		i++
	}
	return out, nil
}
