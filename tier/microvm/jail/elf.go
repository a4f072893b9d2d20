package jail

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// defaultLibDirs are where the dynamic linker looks when neither the
// object nor /etc/ld.so.conf names a directory (glibc's trusted
// directories on Debian's multiarch layout and elsewhere).
var defaultLibDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// Program lists the mounts a dynamically linked program needs in a jail:
// each of objs (the program, and objects it loads itself, such as QEMU's
// modules) at its own path, its ELF interpreter, and every shared library
// they need, transitively, each at the path the host's dynamic linker
// finds it by. libDirs are the directories of those libraries, for
// LD_LIBRARY_PATH: the jail has no /etc/ld.so.cache. Every mount is
// executable code and read-only.
func Program(objs ...string) (mounts []Mount, libDirs []string, err error) {
	conf, err := ldSoConf("/etc/ld.so.conf", 0)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, err
	}
	search := append(conf, defaultLibDirs...)
	byTarget := map[string]bool{}
	sonames := map[string]bool{}
	add := func(target string) error {
		if byTarget[target] {
			return nil
		}
		src, err := filepath.EvalSymlinks(target)
		if err != nil {
			return err
		}
		byTarget[target] = true
		mounts = append(mounts, Mount{Source: src, Target: target, Exec: true})
		return nil
	}
	queue := append([]string(nil), objs...)
	for _, o := range objs {
		if err := add(o); err != nil {
			return nil, nil, err
		}
	}
	for len(queue) > 0 {
		obj := queue[0]
		queue = queue[1:]
		f, err := elf.Open(obj)
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", obj, err)
		}
		interp, needed, dirs, err := dynamic(f, obj)
		machine, class := f.Machine, f.Class
		f.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("read %s: %w", obj, err)
		}
		if interp != "" {
			if err := add(interp); err != nil {
				return nil, nil, fmt.Errorf("interpreter of %s: %w", obj, err)
			}
			// libc names the dynamic linker as needed too; it is loaded
			// already, by its interpreter path.
			sonames[filepath.Base(interp)] = true
		}
		for _, name := range needed {
			if sonames[name] {
				continue
			}
			p := findLib(name, append(dirs, search...), machine, class)
			if p == "" {
				return nil, nil, fmt.Errorf("shared library %s needed by %s not found", name, obj)
			}
			sonames[name] = true
			if err := add(p); err != nil {
				return nil, nil, err
			}
			if d := filepath.Dir(p); !contains(libDirs, d) {
				libDirs = append(libDirs, d)
			}
			queue = append(queue, p)
		}
	}
	return mounts, libDirs, nil
}

// dynamic reads an object's interpreter, needed libraries and its own
// search path (DT_RUNPATH, else DT_RPATH; $ORIGIN is its directory).
func dynamic(f *elf.File, path string) (interp string, needed, dirs []string, err error) {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", nil, nil, err
			}
			interp = strings.TrimRight(string(b), "\x00")
		}
	}
	if f.Section(".dynamic") == nil {
		return interp, nil, nil, nil // static
	}
	if needed, err = f.ImportedLibraries(); err != nil {
		return "", nil, nil, err
	}
	rp, _ := f.DynString(elf.DT_RUNPATH)
	if len(rp) == 0 {
		rp, _ = f.DynString(elf.DT_RPATH)
	}
	for _, s := range rp {
		for _, d := range strings.Split(s, ":") {
			d = strings.ReplaceAll(d, "$ORIGIN", filepath.Dir(path))
			d = strings.ReplaceAll(d, "${ORIGIN}", filepath.Dir(path))
			if filepath.IsAbs(d) {
				dirs = append(dirs, filepath.Clean(d))
			}
		}
	}
	return interp, needed, dirs, nil
}

// findLib is the first name in dirs that is an ELF object of the same
// machine and class (a 32-bit library of the same name is skipped, as the
// dynamic linker does).
func findLib(name string, dirs []string, m elf.Machine, c elf.Class) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		ok := f.Machine == m && f.Class == c
		f.Close()
		if ok {
			return p
		}
	}
	return ""
}

// ldSoConf lists the directories of an ld.so.conf, following its
// "include" lines (globs, relative to the file's directory).
func ldSoConf(path string, depth int) ([]string, error) {
	if depth > 8 {
		return nil, fmt.Errorf("%s: includes nest too deep", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dirs []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if pat, ok := strings.CutPrefix(line, "include"); ok && (strings.HasPrefix(pat, " ") || strings.HasPrefix(pat, "\t")) {
			pat = strings.TrimSpace(pat)
			if !filepath.IsAbs(pat) {
				pat = filepath.Join(filepath.Dir(path), pat)
			}
			files, _ := filepath.Glob(pat)
			for _, inc := range files {
				more, err := ldSoConf(inc, depth+1)
				if err != nil {
					return nil, err
				}
				dirs = append(dirs, more...)
			}
			continue
		}
		if filepath.IsAbs(line) {
			dirs = append(dirs, filepath.Clean(line))
		}
	}
	return dirs, sc.Err()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
