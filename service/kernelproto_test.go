package service

import (
	"strconv"
	"strings"
	"testing"
)

// TestFrameDecoder: whole frames in any split decode; everything that is
// not a well-formed frame of a known message is refused, and stays
// refused.
func TestFrameDecoder(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string // message types
		wantErr string
	}{
		{"one frame", fr(`{"type":"end","id":"c-1","status":"ok"}`), []string{"end"}, ""},
		{"two frames", fr(`{"type":"ready"}`) + fr(`{"type":"ready","ipython":true,"python":"3.11"}`), []string{"ready", "ready"}, ""},
		{"stream", fr(`{"type":"stream","id":"c","name":"stdout","text":"x"}`), []string{"stream"}, ""},
		{"result bundle", fr(`{"type":"result","id":"c","data":{"image/png":"iVBO","text/plain":"x"},"count":2}`), []string{"result"}, ""},
		{"error", fr(`{"type":"error","id":"c","ename":"E","evalue":"v","traceback":["a"]}`), []string{"error"}, ""},
		{"not a digit", "x\n{}", nil, "not a digit"},
		{"empty header", "\n{}", nil, "not a length"},
		{"leading zero", "02\n{}", nil, "leading zero"},
		{"zero length", "0\n", nil, "leading zero"},
		{"too long a header", "123456789012\n", nil, "not a digit"},
		{"over the frame limit", "99999999\n", nil, "over the"},
		{"unknown type", fr(`{"type":"evil"}`), nil, "unknown type"},
		{"unknown field", fr(`{"type":"ready","evil":true}`), nil, "unknown field"},
		{"bad stream name", fr(`{"type":"stream","name":"stdin"}`), nil, "not stdout"},
		{"bad MIME type", fr(`{"type":"display","data":{"text/x-evil":"a"}}`), nil, "MIME type"},
		{"bad end status", fr(`{"type":"end","status":"bad"}`), nil, "status"},
		{"not JSON", fr("hello"), nil, "frame"},
		{"not UTF-8", fr("{\"type\":\"ready\",\"python\":\"\xff\"}"), nil, "UTF-8"},
		{"trailing data in the frame", fr(`{"type":"ready"}{}`), nil, "after the JSON"},
		{"sticky", fr(`{}`) + fr(`{"type":"ready"}`), nil, "unknown type"},
	}
	for _, tc := range tests {
		for _, split := range []int{0, 1, 3} {
			t.Run(tc.name, func(t *testing.T) {
				var d frameDecoder
				var got []string
				var err error
				in := []byte(tc.in)
				for len(in) > 0 {
					n := len(in)
					if split > 0 {
						n = min(split, n)
					}
					if e := d.write(in[:n], func(m *kernelMsg) { got = append(got, m.Type) }); e != nil {
						err = e
					}
					in = in[n:]
				}
				if tc.wantErr == "" {
					if err != nil {
						t.Fatalf("error %v", err)
					}
				} else if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				if strings.Join(got, ",") != strings.Join(tc.want, ",") {
					t.Errorf("messages %v, want %v", got, tc.want)
				}
			})
		}
	}
}

func fr(payload string) string { return strconv.Itoa(len(payload)) + "\n" + payload }

// FuzzKernelFrames: the decoder never panics, keeps at most one frame's
// bytes, and once it fails it delivers nothing more.
func FuzzKernelFrames(f *testing.F) {
	for _, s := range []string{
		"16\n{\"type\":\"ready\"}",
		"41\n{\"type\":\"end\",\"id\":\"c-1\",\"status\":\"ok\"}",
		"49\n{\"type\":\"stream\",\"id\":\"c\",\"name\":\"stdout\",\"text\":\"x\"}",
		"57\n{\"type\":\"result\",\"id\":\"c\",\"data\":{\"image/png\":\"iVBO\"}}",
		"99\n{\"type\":\"error\",\"id\":\"c\",\"ename\":\"ZeroDivisionError\",\"evalue\":\"x\",\"traceback\":[\"a\",\"b\"]}",
		"02\n{}", "99999999999\n", "x",
	} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, in []byte, split int) {
		if split <= 0 {
			split = 1
		}
		var d frameDecoder
		failed := false
		for len(in) > 0 {
			n := min(split, len(in))
			err := d.write(in[:n], func(m *kernelMsg) {
				if failed {
					t.Fatal("a message after the decoder failed")
				}
				if m.Type == "" {
					t.Fatal("a message without a type")
				}
			})
			if err != nil {
				failed = true
			}
			if len(d.body) > maxKernelFrame || len(d.head) > maxFrameDigits {
				t.Fatalf("decoder holds %d+%d bytes", len(d.head), len(d.body))
			}
			in = in[n:]
		}
	})
}
