package service

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// The code kernel's channel to the host (kernel.py): frames of a decimal
// length, a newline and that many bytes of one JSON object. Everything on
// it comes from inside the sandbox, so the decoder is strict and bounded:
// a header of at most maxFrameDigits digits without leading zeros, a
// payload of at most maxKernelFrame bytes, known message types and fields
// only, MIME keys from a fixed set. The first violation is sticky: the
// channel is dead and the kernel is killed (a kernel that breaks framing
// cannot be resynchronised safely).

// maxKernelFrame bounds one frame's payload: a figure as PNG in base64
// fits; more is a broken or hostile kernel.
const maxKernelFrame = 16 << 20

// maxFrameDigits is the longest header maxKernelFrame needs.
var maxFrameDigits = len(strconv.Itoa(maxKernelFrame))

// kernelMimes are the MIME types a result or display may carry.
var kernelMimes = map[string]bool{
	"text/plain": true, "text/html": true, "text/markdown": true, "text/latex": true,
	"image/png": true, "image/jpeg": true, "image/svg+xml": true,
	"application/json": true, "application/javascript": true,
}

// kernelMsg is one message from the kernel.
type kernelMsg struct {
	Type      string            `json:"type"`
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Text      string            `json:"text,omitempty"`
	Data      map[string]string `json:"data,omitempty"`
	Count     int               `json:"count,omitempty"`
	Ename     string            `json:"ename,omitempty"`
	Evalue    string            `json:"evalue,omitempty"`
	Traceback []string          `json:"traceback,omitempty"`
	Status    string            `json:"status,omitempty"`
	IPython   bool              `json:"ipython,omitempty"`
	Python    string            `json:"python,omitempty"`
}

// frameDecoder turns the kernel's stdout into messages. It keeps at most
// one frame's bytes.
type frameDecoder struct {
	head []byte // header digits so far
	body []byte // payload so far, when want > 0
	want int    // payload length; 0 while reading the header
	err  error
}

// write decodes p, calling msg for each whole message. After the first
// error it returns that error and ignores its input.
func (d *frameDecoder) write(p []byte, msg func(*kernelMsg)) error {
	for len(p) > 0 && d.err == nil {
		if d.want == 0 {
			c := p[0]
			p = p[1:]
			switch {
			case c == '\n':
				d.err = d.header()
			case c >= '0' && c <= '9' && len(d.head) < maxFrameDigits:
				d.head = append(d.head, c)
			default:
				d.err = fmt.Errorf("frame header: byte %q after %q is not a digit or the newline (at most %d digits)", c, d.head, maxFrameDigits)
			}
			continue
		}
		n := min(len(p), d.want-len(d.body))
		d.body = append(d.body, p[:n]...)
		p = p[n:]
		if len(d.body) == d.want {
			m, err := decodeKernelMsg(d.body)
			d.body, d.want = d.body[:0], 0
			if err != nil {
				d.err = err
				break
			}
			msg(m)
		}
	}
	if d.body != nil && cap(d.body) > 64<<10 && d.want == 0 {
		d.body = nil // a big frame's buffer is not kept between frames
	}
	return d.err
}

func (d *frameDecoder) header() error {
	h := string(d.head)
	d.head = d.head[:0]
	n, err := strconv.Atoi(h)
	switch {
	case h == "" || err != nil:
		return fmt.Errorf("frame header %q is not a length", h)
	case h[0] == '0':
		return fmt.Errorf("frame header %q: a length has no leading zero and is not zero", h)
	case n > maxKernelFrame:
		return fmt.Errorf("frame of %d bytes is over the %d-byte limit", n, maxKernelFrame)
	}
	d.want = n
	d.body = make([]byte, 0, min(n, 64<<10))
	return nil
}

// decodeKernelMsg decodes and checks one payload.
func decodeKernelMsg(b []byte) (*kernelMsg, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m kernelMsg
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("frame: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("frame: data after the JSON object")
	}
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("frame: not UTF-8")
	}
	switch m.Type {
	case "ready", "end", "error":
	case "stream":
		if m.Name != "stdout" && m.Name != "stderr" {
			return nil, fmt.Errorf("stream frame: name %q is not stdout or stderr", m.Name)
		}
	case "result", "display":
		for k := range m.Data {
			if !kernelMimes[k] {
				return nil, fmt.Errorf("%s frame: MIME type %q is not one Moat passes on", m.Type, k)
			}
		}
	default:
		return nil, fmt.Errorf("frame: unknown type %q", m.Type)
	}
	if m.Type == "end" {
		switch m.Status {
		case "ok", "error", "interrupted":
		default:
			return nil, fmt.Errorf("end frame: status %q is not ok, error or interrupted", m.Status)
		}
	}
	return &m, nil
}
