package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

func TestParseDockerfile(t *testing.T) {
	sh := func(s string) []string { return []string{"/bin/sh", "-c", s} }
	tests := []struct {
		name  string
		file  string
		args  map[string]string
		base  string
		steps []Step // compared on the fields set here (Line and Text ignored)
		notes int
	}{
		{name: "from only", file: "FROM python\n", base: "python"},
		{name: "keywords are case-insensitive", file: "from python\nrun true\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("true")}}},
		{name: "run shell form", file: "FROM python\nRUN pip install x && echo $HOME\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("pip install x && echo $HOME")}}},
		{name: "run exec form", file: "FROM python\nRUN [\"python3\", \"-c\", \"print(1)\"]\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: []string{"python3", "-c", "print(1)"}}}},
		{name: "run bad json is a shell command", file: "FROM python\nRUN [not json\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("[not json")}}},
		{name: "continuation, comments inside and blank lines", file: "# a comment\n\nFROM python\nRUN echo a \\\n# inside\n\n  && echo b\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("echo a   && echo b")}}},
		{name: "escape directive", file: "# escape=`\nFROM python\nRUN echo a `\n && echo b\nWORKDIR C:`app\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("echo a  && echo b")}, {Op: OpWorkdir, Dir: "C:app"}}},
		{name: "syntax directive ignored", file: "# syntax=docker/dockerfile:1\nFROM python\n", base: "python"},
		{name: "copy and add", file: "FROM python\nCOPY a.py b/ /app/\nADD [\"c d.txt\", \"/app/c.txt\"]\nCOPY --chown=sandbox:sandbox e /home/sandbox/e\n", base: "python",
			steps: []Step{
				{Op: OpCopy, Sources: []string{"a.py", "b/"}, Dest: "/app/"},
				{Op: OpCopy, Sources: []string{"c d.txt"}, Dest: "/app/c.txt"},
				{Op: OpCopy, Sources: []string{"e"}, Dest: "/home/sandbox/e", Chown: "1000"},
			}},
		{name: "copy relative dest joins workdir", file: "FROM python\nWORKDIR /app\nCOPY x sub/\n", base: "python",
			steps: []Step{{Op: OpWorkdir, Dir: "/app"}, {Op: OpCopy, Sources: []string{"x"}, Dest: "/app/sub/"}}},
		{name: "env forms", file: "FROM python\nENV A=1 B=\"two words\" C='$A'\nENV D the rest of line\nENV E=$A-${B}\n", base: "python",
			steps: []Step{
				{Op: OpEnv, Key: "A", Value: "1"},
				{Op: OpEnv, Key: "B", Value: "two words"},
				{Op: OpEnv, Key: "C", Value: "$A"},
				{Op: OpEnv, Key: "D", Value: "the rest of line"},
				{Op: OpEnv, Key: "E", Value: "1-two words"},
			}},
		{name: "env pairs see the values from before the line", file: "FROM python\nENV A=1\nENV A=2 B=$A\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "A", Value: "1"}, {Op: OpEnv, Key: "A", Value: "2"}, {Op: OpEnv, Key: "B", Value: "1"}}},
		{name: "env referring to the base's variable is expanded later", file: "FROM python\nENV PATH=/app/bin:$PATH\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "PATH", Value: "/app/bin:$PATH", Expand: true}}},
		{name: "defaults and alternatives", file: "FROM python\nARG V=\nARG W=w\nENV A=${V:-dflt} B=${V:+alt} C=${V-x} D=${W:+alt}\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "A", Value: "dflt"}, {Op: OpEnv, Key: "B", Value: ""}, {Op: OpEnv, Key: "C", Value: ""}, {Op: OpEnv, Key: "D", Value: "alt"}}},
		{name: "unset names keep their default for the builder", file: "FROM python\nARG V\nENV A=${V:-dflt}\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "A", Value: "${V:-dflt}", Expand: true}}},
		{name: "workdir relative joins previous", file: "FROM python\nWORKDIR /a\nWORKDIR b\nWORKDIR ../c\n", base: "python",
			steps: []Step{{Op: OpWorkdir, Dir: "/a"}, {Op: OpWorkdir, Dir: "/a/b"}, {Op: OpWorkdir, Dir: "/a/c"}}},
		{name: "workdir relative without previous is left to the builder", file: "FROM python\nWORKDIR app\n", base: "python",
			steps: []Step{{Op: OpWorkdir, Dir: "app"}}},
		{name: "user", file: "FROM python\nARG U=sandbox\nUSER $U\n", base: "python",
			steps: []Step{{Op: OpUser, User: "sandbox"}}},
		{name: "arg before from names the base", file: "ARG BASE=python\nFROM ${BASE}\n", base: "python"},
		{name: "build arg overrides default", file: "ARG BASE=python\nFROM $BASE\n", args: map[string]string{"BASE": "node"}, base: "node"},
		{name: "bare arg after from inherits the global", file: "ARG V=1\nFROM python\nARG V\nRUN echo\nENV X=$V\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("echo"), BuildEnv: []string{"V=1"}}, {Op: OpEnv, Key: "X", Value: "1"}}},
		{name: "global arg is not in scope after from", file: "ARG V=1\nFROM python\nENV X=${V:-unset}\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "X", Value: "${V:-unset}", Expand: true}}},
		{name: "run gets args as build env", file: "FROM python\nARG A=1 B\nARG C=3\nRUN true\n", args: map[string]string{"B": "2"}, base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("true"), BuildEnv: []string{"A=1", "B=2", "C=3"}}}},
		{name: "cmd and entrypoint forms", file: "FROM python\nENTRYPOINT [\"python3\"]\nCMD [\"-c\", \"print(1)\"]\nCMD python3 app.py\nCMD []\n", base: "python",
			steps: []Step{
				{Op: OpEntrypoint, Argv: []string{"python3"}},
				{Op: OpCmd, Argv: []string{"-c", "print(1)"}},
				{Op: OpCmd, Argv: sh("python3 app.py")},
				{Op: OpCmd, Argv: []string{}},
			}},
		{name: "cmd is not substituted", file: "FROM python\nENV A=1\nCMD echo $A\n", base: "python",
			steps: []Step{{Op: OpEnv, Key: "A", Value: "1"}, {Op: OpCmd, Argv: sh("echo $A")}}},
		{name: "ignored instructions leave notes", file: "FROM python\nLABEL a=b\nEXPOSE 80\nSTOPSIGNAL SIGTERM\nHEALTHCHECK NONE\nMAINTAINER me\n", base: "python", notes: 5},
		{name: "crlf line endings", file: "FROM python\r\nRUN true\r\n", base: "python",
			steps: []Step{{Op: OpRun, Argv: sh("true")}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseDockerfile("Dockerfile", []byte(tc.file), tc.args)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if p.Base.Image != tc.base {
				t.Errorf("base = %q, want %q", p.Base.Image, tc.base)
			}
			if len(p.Notes) != tc.notes {
				t.Errorf("notes = %q, want %d", p.Notes, tc.notes)
			}
			got := make([]Step, len(p.Steps))
			for i, s := range p.Steps {
				if s.Line < 1 || s.Text == "" {
					t.Errorf("step %d has no line or text: %+v", i, s)
				}
				s.Line, s.Text = 0, ""
				got[i] = s
			}
			if len(tc.steps) == 0 && len(got) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tc.steps) {
				t.Errorf("steps:\n got %+v\nwant %+v", got, tc.steps)
			}
		})
	}
}

func TestParseDockerfileLines(t *testing.T) {
	p, err := parseDockerfile("Dockerfile", []byte("# c\nFROM python\n\nRUN a \\\n  b\nENV X=1\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Steps[0].Line != 4 || p.Steps[1].Line != 6 {
		t.Errorf("lines = %d, %d, want 4, 6", p.Steps[0].Line, p.Steps[1].Line)
	}
}

func TestParseDockerfileRefusals(t *testing.T) {
	tests := []struct {
		name string
		file string
		args map[string]string
		want string // regexp the error must match
	}{
		{name: "empty", file: "", want: `no FROM instruction`},
		{name: "instruction before from", file: "RUN true\nFROM python\n", want: `Dockerfile:1: RUN before FROM`},
		{name: "scratch", file: "FROM scratch\n", want: `Dockerfile:1: FROM scratch is not supported`},
		{name: "multi-stage AS", file: "FROM python AS build\n", want: `Dockerfile:1: FROM \.\.\. AS build is not supported: multi-stage`},
		{name: "second from", file: "FROM python\nFROM node\n", want: `Dockerfile:2: a second FROM is not supported`},
		{name: "registry reference", file: "FROM docker.io/library/python:3.11\n", want: `Dockerfile:1: FROM docker.io/library/python:3.11: Moat images are named without registry, tag or digest`},
		{name: "platform", file: "FROM --platform=linux/arm64 python\n", want: `Dockerfile:1: FROM --platform is not supported`},
		{name: "heredoc run", file: "FROM python\nRUN <<EOF\necho\nEOF\n", want: `Dockerfile:2: RUN with a heredoc \(<<\) is not supported`},
		{name: "heredoc copy", file: "FROM python\nCOPY <<-'X' /a\n", want: `Dockerfile:2: COPY with a heredoc`},
		{name: "run mount", file: "FROM python\nRUN --mount=type=cache,target=/root/.cache pip install x\n", want: `Dockerfile:2: RUN --mount is not supported`},
		{name: "run network", file: "FROM python\nRUN --network=host true\n", want: `Dockerfile:2: RUN --network is not supported`},
		{name: "copy from", file: "FROM python\nCOPY --from=build /a /b\n", want: `Dockerfile:2: COPY --from is not supported`},
		{name: "copy chmod", file: "FROM python\nCOPY --chmod=755 a /b\n", want: `Dockerfile:2: COPY --chmod is not supported`},
		{name: "chown other user", file: "FROM python\nCOPY --chown=www-data a /b\n", want: `Dockerfile:2: COPY --chown=www-data: owner "www-data" is not supported`},
		{name: "chown mixed", file: "FROM python\nCOPY --chown=0:1000 a /b\n", want: `owner "0:1000" is not supported`},
		{name: "add url", file: "FROM python\nADD https://example.com/x.tgz /x\n", want: `Dockerfile:2: ADD https://example.com/x.tgz is not supported: a build fetches nothing`},
		{name: "add git", file: "FROM python\nADD git@github.com:a/b.git /x\n", want: `Dockerfile:2: ADD git@github.com:a/b.git is not supported`},
		{name: "copy outside context", file: "FROM python\nCOPY ../secret /x\n", want: `Dockerfile:2: COPY \.\./secret: source is outside the build context`},
		{name: "copy without dest", file: "FROM python\nCOPY a\n", want: `Dockerfile:2: COPY wants at least one source and a destination`},
		{name: "shell", file: "FROM python\nSHELL [\"/bin/bash\", \"-c\"]\n", want: `Dockerfile:2: SHELL is not supported`},
		{name: "volume", file: "FROM python\nVOLUME /data\n", want: `Dockerfile:2: VOLUME is not supported`},
		{name: "onbuild", file: "FROM python\nONBUILD RUN true\n", want: `Dockerfile:2: ONBUILD is not supported`},
		{name: "unknown instruction", file: "FROM python\nFROB x\n", want: `Dockerfile:2: FROB is not supported: not a Dockerfile instruction`},
		{name: "unknown build arg", file: "FROM python\nARG A\n", args: map[string]string{"B": "1"}, want: `--build-arg B: the Dockerfile declares no ARG`},
		{name: "bad arg name", file: "FROM python\nARG 1x=2\n", want: `Dockerfile:2: ARG "1x"`},
		{name: "env without value", file: "FROM python\nENV\n", want: `Dockerfile:2: ENV: want NAME=value`},
		{name: "env bad pair", file: "FROM python\nENV A=1 B\n", want: `Dockerfile:2: ENV: "B" is not NAME=value`},
		{name: "env unterminated quote", file: "FROM python\nENV A=\"x\n", want: `Dockerfile:2: ENV: unterminated " quote`},
		{name: "bad substitution", file: "FROM python\nENV A=${B:?err}\n", want: `Dockerfile:2: ENV: bad substitution`},
		{name: "unterminated brace", file: "FROM python\nWORKDIR ${A\n", want: `Dockerfile:2: WORKDIR: unterminated \$\{`},
		{name: "bad escape directive", file: "# escape=x\nFROM python\n", want: `Dockerfile:1: escape="x" is not supported`},
		{name: "directive twice", file: "# escape=\\\n# escape=`\nFROM python\n", want: `Dockerfile:2: parser directive "escape" given twice`},
		{name: "empty run", file: "FROM python\nRUN\n", want: `Dockerfile:2: RUN: no command`},
		{name: "empty user", file: "FROM python\nUSER\n", want: `Dockerfile:2: USER wants a user`},
		{name: "empty from after substitution", file: "ARG B\nFROM $B\n", want: `Dockerfile:2: FROM \$B: the image name is empty`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := parseDockerfile("Dockerfile", []byte(tc.file), tc.args)
			if err == nil {
				t.Fatalf("parse = %+v, want an error matching %q", p, tc.want)
			}
			if !regexp.MustCompile(tc.want).MatchString(err.Error()) {
				t.Errorf("error %q does not match %q", err, tc.want)
			}
		})
	}
}

func TestReadDockerfile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var tgz bytes.Buffer
	zw := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "a", Mode: 0o644, Size: 1})
	tw.Write([]byte("a"))
	tw.Close()
	zw.Close()
	var plainTar bytes.Buffer
	tw = tar.NewWriter(&plainTar)
	tw.WriteHeader(&tar.Header{Name: "a", Mode: 0o644, Size: 1})
	tw.Write([]byte("a"))
	tw.Close()
	write("app.tgz", tgz.Bytes())
	write("data.bin", plainTar.Bytes())
	write("notes.txt", []byte("plain text\n"))
	tests := []struct {
		name, file, want string
	}{
		{name: "add of a text file copies it", file: "FROM python\nADD notes.txt /n\n"},
		{name: "add of a gzip archive is refused", file: "FROM python\nADD app.tgz /app/\n", want: "app.Dockerfile:2: ADD app.tgz is not supported: it is an archive"},
		{name: "add of a tar by content is refused", file: "FROM python\nADD data.* /d/\n", want: "ADD data.* is not supported: it is an archive"},
		{name: "copy of an archive copies it", file: "FROM python\nCOPY app.tgz /app/\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			write("app.Dockerfile", []byte(tc.file))
			p, err := ReadDockerfile(filepath.Join(dir, "app.Dockerfile"), dir, nil)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.Context != dir || !strings.HasSuffix(p.File, "app.Dockerfile") {
					t.Errorf("plan file/context = %q/%q", p.File, p.Context)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ReadDockerfile = %v, want %q", err, tc.want)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		if _, err := ReadDockerfile(filepath.Join(dir, "nope"), dir, nil); err == nil || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("ReadDockerfile(missing) = %v", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		write("big", bytes.Repeat([]byte("# x\n"), maxDockerfileBytes/4+1))
		if _, err := ReadDockerfile(filepath.Join(dir, "big"), dir, nil); err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("ReadDockerfile(big) = %v", err)
		}
	})
}

func TestExpand(t *testing.T) {
	env := []string{"PATH=/usr/bin", "HOME=/root", "EMPTY="}
	tests := []struct{ in, want string }{
		{"/app/bin:$PATH", "/app/bin:/usr/bin"},
		{"${HOME}/x", "/root/x"},
		{"${EMPTY:-d} ${EMPTY-d} ${UNSET:-d} ${HOME:+set}", "d  d set"},
		{"it's \"$HOME\"", "it's \"/root\""}, // quotes were removed by the reader
		{"$ lone and $1", "$ lone and $1"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := Expand(tc.in, env)
			if err != nil || got != tc.want {
				t.Errorf("Expand(%q) = %q, %v, want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func FuzzReadDockerfile(f *testing.F) {
	for _, s := range []string{
		"FROM python\nRUN pip install x\nCOPY . /app\nENV A=1 B=\"x y\"\nWORKDIR /app\nUSER sandbox\nCMD [\"python3\", \"app.py\"]\n",
		"# escape=`\nARG V=1\nFROM ${BASE:-python}\nRUN echo `\n  a\nENV P=/x:$PATH\nENTRYPOINT python3\n",
		"FROM python AS b\n", "FROM python\nRUN <<EOF\nx\nEOF\n", "FROM python\nENV A=${B:-${C:+d}}\n",
		"FROM python\nCOPY --chown=sandbox [\"a b\", \"/c/\"]\nADD x y\nLABEL a=b\n",
	} {
		f.Add(s)
	}
	lineRE := regexp.MustCompile(`^Dockerfile(:\d+)?: `)
	f.Fuzz(func(t *testing.T, data string) {
		p, err := parseDockerfile("Dockerfile", []byte(data), map[string]string{})
		if err != nil {
			if !lineRE.MatchString(err.Error()) {
				t.Errorf("error %q does not name the file (and line)", err)
			}
			return
		}
		if p.Base.Image == "" {
			t.Errorf("plan without a base from %q", data)
		}
		for _, s := range p.Steps {
			if s.Line < 1 {
				t.Errorf("step %+v has no line", s)
			}
			switch s.Op {
			case OpRun, OpEntrypoint, OpCmd:
				if s.Op == OpRun && len(s.Argv) == 0 {
					t.Errorf("RUN without argv: %+v", s)
				}
			case OpCopy:
				if len(s.Sources) == 0 {
					t.Errorf("COPY without sources: %+v", s)
				}
				for _, src := range s.Sources {
					if strings.HasPrefix(filepath.Clean(src), "..") {
						t.Errorf("COPY source %q leaves the context", src)
					}
				}
			}
		}
	})
}
