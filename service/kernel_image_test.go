package service_test

import (
	"bytes"
	"encoding/base64"
	"image/png"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// pngSignature starts every PNG file (RFC 2083, 3.1).
const pngSignature = "\x89PNG\r\n\x1a\n"

// displays returns the MIME bundles of a cell's display outputs.
func displays(c service.Cell) []map[string]string {
	var out []map[string]string
	for _, o := range c.Outputs {
		if o.Type == "display" {
			out = append(out, o.Data)
		}
	}
	return out
}

// checkPNG decodes a base64 image/png and returns its size.
func checkPNG(t *testing.T, b64 string) (w, h int) {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("image/png is not base64: %v", err)
	}
	if !strings.HasPrefix(string(raw), pngSignature) {
		t.Fatalf("image/png does not start with the PNG signature: % x", raw[:min(len(raw), 8)])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("image/png does not decode: %v", err)
	}
	if _, err := png.Decode(bytes.NewReader(raw)); err != nil {
		t.Fatalf("image/png's pixels do not decode: %v", err)
	}
	return cfg.Width, cfg.Height
}

// TestKernelCodeInterpreterImage runs cells in the code-interpreter image
// on the native tier: the kernel is IPython's, rich reprs and display()
// come back as MIME bundles, real matplotlib figures as PNGs, pandas
// DataFrames as HTML tables, and the kernel leaves nothing in the
// workspace. The image is built here when missing (once per machine and
// definition: about 1-2 minutes).
func TestKernelCodeInterpreterImage(t *testing.T) {
	s := nativeService(t, "code-interpreter", true)
	id := kernelSandbox(t, s, false, func(m *manifest.Manifest) {
		m.Image = "code-interpreter"
		// The sandbox outlives all the cells on a loaded machine: the
		// first import of matplotlib builds its font cache.
		m.Resources.Timeout = manifest.Duration(2 * time.Minute)
	})
	tests := []struct {
		name, code string
		check      func(t *testing.T, c service.Cell)
	}{
		{"IPython runs the cell", "get_ipython() is not None", func(t *testing.T, c service.Cell) {
			if c.Result["text/plain"] != "True" {
				t.Errorf("result %v, want True: the kernel is not IPython's", c.Result)
			}
		}},
		{"magics", "%time x = 6 * 7\nx", func(t *testing.T, c service.Cell) {
			if c.Result["text/plain"] != "42" || !strings.Contains(text(c, "stdout"), "Wall time") {
				t.Errorf("result %v stdout %q, want 42 and %%time's report", c.Result, text(c, "stdout"))
			}
		}},
		{"last expression's rich repr", "from IPython.display import HTML, Markdown\nHTML('<b>bold</b>')", func(t *testing.T, c service.Cell) {
			if c.Result["text/html"] != "<b>bold</b>" {
				t.Errorf("result %v, want text/html <b>bold</b>", c.Result)
			}
		}},
		{"display() in order with print", "print('before')\ndisplay(HTML('<i>it</i>'), Markdown('# md'))\nprint('after')", func(t *testing.T, c service.Cell) {
			var got []string
			for _, o := range c.Outputs {
				switch o.Type {
				case "stdout":
					got = append(got, strings.TrimSpace(o.Text))
				case "display":
					got = append(got, o.Data["text/html"]+o.Data["text/markdown"])
				}
			}
			if want := "before|<i>it</i>|# md|after"; strings.Join(got, "|") != want {
				t.Errorf("outputs %q, want %q", strings.Join(got, "|"), want)
			}
			if c.Result != nil {
				t.Errorf("result %v, want none (display is not the cell's value)", c.Result)
			}
		}},
		{"a matplotlib figure is a PNG", "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 2), dpi=100)\nplt.plot([1, 3, 2])\nplt.title('t')", func(t *testing.T, c service.Cell) {
			d := displays(c)
			if len(d) != 1 || d[0]["image/png"] == "" {
				t.Fatalf("displays %v, want one image/png", d)
			}
			w, h := checkPNG(t, d[0]["image/png"])
			// 4x2 inches at 100 dpi, trimmed by bbox_inches="tight".
			if w < 250 || w > 450 || h < 120 || h > 250 || w <= h {
				t.Errorf("PNG is %dx%d, want about 400x200", w, h)
			}
			if e := text(c, "stderr"); e != "" {
				t.Errorf("stderr %q, want none (a matplotlib cache warning means MPLCONFIGDIR is not writable)", e)
			}
		}},
		{"plt.show() shows each figure once", "plt.plot([1, 2]); plt.show()\nplt.figure(); plt.bar(['a', 'b'], [1, 2]); plt.show()", func(t *testing.T, c service.Cell) {
			d := displays(c)
			if len(d) != 2 {
				t.Fatalf("%d displays, want 2 (one per figure)", len(d))
			}
			for _, b := range d {
				checkPNG(t, b["image/png"])
			}
			if e := text(c, "stderr"); e != "" {
				t.Errorf("stderr %q, want none", e)
			}
		}},
		{"plt.show() shows the figure where it is called", "print('a')\nplt.plot([1, 2]); plt.show()\nprint('b')", func(t *testing.T, c service.Cell) {
			var got []string
			for _, o := range c.Outputs {
				got = append(got, o.Type)
			}
			if strings.Join(got, ",") != "stdout,display,stdout" {
				t.Fatalf("outputs %v, want stdout, the figure, stdout", got)
			}
			checkPNG(t, c.Outputs[1].Data["image/png"])
		}},
		{"figures are closed after their cell", "len(plt.get_fignums())", func(t *testing.T, c service.Cell) {
			if c.Result["text/plain"] != "0" || len(displays(c)) != 0 {
				t.Errorf("result %v, %d displays: figures of an earlier cell shown again", c.Result, len(displays(c)))
			}
		}},
		{"a pandas DataFrame is an HTML table", "import numpy as np, pandas as pd\ndf = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': np.array([3.5, 19.0])})\ndf", func(t *testing.T, c service.Cell) {
			html := c.Result["text/html"]
			if !strings.Contains(html, "<table") || !strings.Contains(html, "Oslo") || !strings.Contains(html, "19.0") {
				t.Errorf("text/html %q, want the DataFrame's table", html)
			}
			if !strings.Contains(c.Result["text/plain"], "city") {
				t.Errorf("text/plain %q, want the DataFrame's columns", c.Result["text/plain"])
			}
		}},
		{"a plot of a DataFrame", "ax = df.plot.bar(x='city', y='temp')\nax.figure.savefig('chart.png')", func(t *testing.T, c service.Cell) {
			d := displays(c)
			if len(d) != 1 {
				t.Fatalf("%d displays, want 1", len(d))
			}
			checkPNG(t, d[0]["image/png"])
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := runCell(t, s, id, tc.code, 0)
			if c.Status != service.CellOK {
				t.Fatalf("status %q, want ok (%+v)", c.Status, c)
			}
			tc.check(t, c)
		})
	}
	t.Run("the kernel leaves nothing in the workspace", func(t *testing.T) {
		checkWorkspace(t, s, id, "chart.png")
	})
	k, err := s.GetKernel(t.Context(), keyA, id, "")
	if err != nil || !k.IPython {
		t.Errorf("GetKernel: %+v, %v; want an IPython kernel", k, err)
	}
}

// checkWorkspace fails if the top of the workspace holds anything but
// want: IPython's profile and history (~/.ipython) and matplotlib's font
// cache (~/.config/matplotlib, ~/.cache) belong in /tmp, not among the
// files the program made (HOME is /workspace).
func checkWorkspace(t *testing.T, s *service.Service, id string, want ...string) {
	t.Helper()
	entries, err := s.ListDir(t.Context(), keyA, id, ".")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("workspace holds %q, want %q", got, want)
	}
}

// TestKernelIPythonWorkspace: on the fake backend (the host's python3,
// run in the session's workspace with HOME there, as in a sandbox), an
// IPython kernel keeps its profile and history out of the workspace.
func TestKernelIPythonWorkspace(t *testing.T) {
	if !servicetest.HostPython() {
		t.Skip("needs python3 on the host: the fake backend runs the kernel driver with it")
	}
	s, _, _ := newService(t, nil)
	id := kernelSandbox(t, s, false, nil)
	c := runCell(t, s, id, "open('made.txt', 'w').write('x')\n1", 0)
	if c.Status != service.CellOK {
		t.Fatalf("status %q (%+v)", c.Status, c)
	}
	k, err := s.GetKernel(t.Context(), keyA, id, "")
	if err != nil {
		t.Fatal(err)
	}
	if !k.IPython {
		t.Skip("needs IPython on the host (python3 -c 'import IPython')")
	}
	checkWorkspace(t, s, id, "made.txt")
}
