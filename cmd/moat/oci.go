package main

// moat oci (and the moat binary run as moat-runtime): the runc-compatible
// OCI runtime that containerd's runc shim and dockerd call. Flags and
// commands only; package ociruntime does the work (docs/RUNTIME.md).

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/ociruntime"
)

// runtimeName is the name under which the moat binary is the OCI runtime
// (a symlink for containerd's BinaryName or dockerd --add-runtime).
const runtimeName = "moat-runtime"

// isRuntime reports whether this process was started as moat-runtime.
func isRuntime() bool { return filepath.Base(os.Args[0]) == runtimeName }

const ociUsage = `Usage: moat oci [GLOBAL FLAGS] COMMAND [FLAGS] ID [ARGS]
       moat-runtime [GLOBAL FLAGS] COMMAND [FLAGS] ID [ARGS]

Moat as an OCI runtime, with runc's command line, for containerd's runc
shim (BinaryName) and dockerd --add-runtime. See docs/RUNTIME.md.

Commands: create, start, state, kill, delete, exec, ps, features, list.
Refused: pause, resume, update, checkpoint, restore, events, run, spec.

Global flags:
`

type ociGlobals struct {
	root, log, logFormat, policy string
	debug, systemdCgroup         bool
	version                      bool
}

func cmdOCI(args []string) int {
	if len(args) == 1 && args[0] == ociruntime.ProxyArg {
		return ociruntime.ProxyMain()
	}
	fs := flag.NewFlagSet("oci", flag.ContinueOnError)
	fs.SetOutput(helpOutput(args))
	fs.Usage = func() { fmt.Fprint(fs.Output(), ociUsage); fs.PrintDefaults() }
	var g ociGlobals
	fs.StringVar(&g.root, "root", ociruntime.DefaultRoot, "directory of the containers' state")
	fs.StringVar(&g.log, "log", "", "append the runtime's log to this file")
	fs.StringVar(&g.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&g.policy, "policy", os.Getenv("MOAT_RUNTIME_POLICY"), "runtime policy file (default "+ociruntime.DefaultPolicyFile+", or $MOAT_RUNTIME_POLICY)")
	fs.BoolVar(&g.debug, "debug", false, "log debug messages")
	fs.BoolVar(&g.systemdCgroup, "systemd-cgroup", false, "refused: Moat makes its containers' cgroups itself")
	fs.BoolVar(&g.version, "version", false, "print the version")
	fs.BoolVar(&g.version, "v", false, "print the version")
	fs.String("criu", "", "ignored (checkpointing is refused)")
	fs.Bool("rootless", false, "ignored")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if g.version {
		fmt.Printf("%s version %s\ncommit: %s\nspec: %s\n", runtimeName, versionString(), versionString(), ociruntime.OCIVersion)
		return 0
	}
	w, err := ociruntime.OpenLog(g.log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", runtimeName, err)
		return 1
	}
	if c, ok := w.(io.Closer); ok {
		defer c.Close()
	}
	logger, err := ociruntime.NewLogger(w, g.logFormat, g.debug)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", runtimeName, err)
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitUsage
	}
	logger.Debugf("%s %s", runtimeName, strings.Join(args, " "))
	// Every failure goes to the log (which the engine shows its user)
	// and to stderr.
	failed := func(err error) int {
		logger.Errorf("%v", err)
		fmt.Fprintf(os.Stderr, "%s: %v\n", runtimeName, err)
		return 1
	}
	if g.systemdCgroup {
		return failed(errors.New("--systemd-cgroup: Moat makes its containers' cgroups itself (moat/<id>); configure the engine's moat runtime without the systemd cgroup driver (containerd: SystemdCgroup = false in the runtime's options)"))
	}
	cmd, cargs := rest[0], rest[1:]
	if cmd == "features" {
		return ociPrintJSON(ociruntime.Features())
	}
	if cmd == "list" {
		return ociList(g.root, failed)
	}
	pol, err := ociruntime.LoadPolicy(g.policy)
	if err != nil {
		return failed(err)
	}
	// The container's init is moat-guest where it matches this moat (a
	// smaller binary, a faster start), as for every native-tier run.
	exe, why := engine.GuestBinary()
	logger.Debugf("container init: %s", why)
	rt := &ociruntime.Runtime{Root: g.root, Policy: pol, Log: logger, Exe: exe}
	if err := ociCommand(rt, cmd, cargs); err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			failed(err)
			return exitUsage
		}
		return failed(err)
	}
	return 0
}

func ociCommand(rt *ociruntime.Runtime, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	oneID := func() (string, error) {
		if err := fs.Parse(args); err != nil {
			return "", usageError{fmt.Errorf("%s: %w", cmd, err)}
		}
		if fs.NArg() < 1 {
			return "", usageError{fmt.Errorf("%s: give the container id", cmd)}
		}
		return fs.Arg(0), nil
	}
	switch cmd {
	case "create", "run":
		var o ociruntime.CreateOptions
		fs.StringVar(&o.Bundle, "bundle", ".", "bundle directory")
		fs.StringVar(&o.Bundle, "b", ".", "bundle directory")
		fs.StringVar(&o.PidFile, "pid-file", "", "write the init's pid here")
		fs.StringVar(&o.ConsoleSocket, "console-socket", "", "unix socket to send the terminal to")
		fs.Bool("no-pivot", false, "ignored: Moat always pivots")
		fs.Bool("no-new-keyring", false, "ignored: Moat's seccomp policy denies the keyring")
		preserve := fs.Int("preserve-fds", 0, "refused when not 0")
		id, err := oneID()
		if err != nil {
			return err
		}
		if *preserve != 0 {
			return fmt.Errorf("--preserve-fds %d: Moat passes no descriptors but stdio into a container", *preserve)
		}
		if cmd == "run" {
			return errors.New("run: use create then start (Moat's runtime does not implement run)")
		}
		return rt.Create(id, o)
	case "start":
		id, err := oneID()
		if err != nil {
			return err
		}
		return rt.Start(id)
	case "state":
		id, err := oneID()
		if err != nil {
			return err
		}
		st, err := rt.State(id)
		if err != nil {
			return err
		}
		ociPrintJSON(st)
		return nil
	case "kill":
		all := fs.Bool("all", false, "signal every process of the container")
		fs.BoolVar(all, "a", false, "signal every process of the container")
		id, err := oneID()
		if err != nil {
			return err
		}
		sig, err := ociruntime.ParseSignal(fs.Arg(1))
		if err != nil {
			return usageError{err}
		}
		return rt.Kill(id, sig, *all)
	case "delete":
		force := fs.Bool("force", false, "kill a running container first")
		fs.BoolVar(force, "f", false, "kill a running container first")
		id, err := oneID()
		if err != nil {
			return err
		}
		return rt.Delete(id, *force)
	case "ps":
		format := fs.String("format", "table", "table or json")
		fs.StringVar(format, "f", "table", "table or json")
		id, err := oneID()
		if err != nil {
			return err
		}
		pids, err := rt.Ps(id)
		if err != nil {
			return err
		}
		if *format == "json" {
			ociPrintJSON(pids)
			return nil
		}
		fmt.Println("PID")
		for _, p := range pids {
			fmt.Println(p)
		}
		return nil
	case "exec":
		code, err := ociExec(rt, fs, args)
		if err == nil && code != 0 {
			os.Exit(code)
		}
		return err
	case "pause", "resume", "update", "checkpoint", "restore", "events":
		return fmt.Errorf("%s: not supported by Moat's runtime (see docs/RUNTIME.md); the container is unaffected", cmd)
	}
	return usageError{fmt.Errorf("unknown command %q; Moat's runtime has create, start, state, kill, delete, exec, ps, features, list", cmd)}
}

func ociList(root string, failed func(error) int) int {
	rt := &ociruntime.Runtime{Root: root}
	ids, err := rt.List()
	if err != nil {
		return failed(err)
	}
	fmt.Println("ID\tPID\tSTATUS\tBUNDLE")
	for _, id := range ids {
		if st, err := rt.State(id); err == nil {
			fmt.Printf("%s\t%d\t%s\t%s\n", st.ID, st.Pid, st.Status, st.Bundle)
		}
	}
	return 0
}

func ociPrintJSON(v any) int {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Println(string(b))
	return 0
}

// stringList is a repeatable string flag (exec --env).
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// ociExec runs exec: flags, then the id, then the command's arguments.
func ociExec(rt *ociruntime.Runtime, fs *flag.FlagSet, args []string) (int, error) {
	var o ociruntime.ExecOptions
	var env stringList
	fs.StringVar(&o.ProcessFile, "process", "", "process.json of the process to run")
	fs.StringVar(&o.ProcessFile, "p", "", "process.json of the process to run")
	fs.BoolVar(&o.Detach, "detach", false, "return once the process started")
	fs.BoolVar(&o.Detach, "d", false, "return once the process started")
	fs.StringVar(&o.PidFile, "pid-file", "", "write the process's pid here")
	fs.StringVar(&o.ConsoleSocket, "console-socket", "", "refused: no terminals yet")
	fs.BoolVar(&o.TTY, "tty", false, "refused: no terminals yet")
	fs.BoolVar(&o.TTY, "t", false, "refused: no terminals yet")
	fs.StringVar(&o.Cwd, "cwd", "", "working directory")
	fs.Var(&env, "env", "KEY=VALUE to add (repeatable)")
	fs.Var(&env, "e", "KEY=VALUE to add (repeatable)")
	user := fs.String("user", "", "refused unless the container's user")
	fs.StringVar(user, "u", "", "refused unless the container's user")
	var caps stringList
	fs.Var(&caps, "cap", "refused: no capability is added")
	fs.Var(&caps, "c", "refused: no capability is added")
	fs.Bool("no-new-privs", false, "ignored: always set")
	fs.String("process-label", "", "ignored")
	fs.String("apparmor", "", "ignored")
	preserve := fs.Int("preserve-fds", 0, "refused when not 0")
	if err := fs.Parse(args); err != nil {
		return 0, usageError{fmt.Errorf("exec: %w", err)}
	}
	if fs.NArg() < 1 {
		return 0, usageError{errors.New("exec: give the container id")}
	}
	if *preserve != 0 || *user != "" || len(caps) > 0 {
		return 0, errors.New("exec: --preserve-fds, --user and --cap are not supported: every process of a Moat container runs as its user, with its stdio only")
	}
	o.Env = env
	o.Args = fs.Args()[1:]
	if o.ProcessFile == "" && len(o.Args) == 0 {
		return 0, usageError{errors.New("exec: give --process FILE or the command to run after the id")}
	}
	return rt.Exec(fs.Arg(0), o)
}
