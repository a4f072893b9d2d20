package main

// moat image build and moat image list: the root images (package image,
// through the engine's store).

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
)

func cmdImage(args []string) int {
	const usage = "Usage:\n  moat image build [--locked] [NAME]   build an image (default python) from Debian packages\n  moat image list                      list built images\n\nFlags:\n"
	fs := newFlags("image", usage)
	locked := fs.Bool("locked", false, "fail if the resolved package versions differ from the lockfile")
	lockDir := fs.String("lockfile-dir", "", "`DIR` holding NAME.lock to record versions in (e.g. images/ in a checkout)")
	if len(args) == 0 {
		fs.Usage()
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" {
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return 0
	}
	sub := args[0]
	if c := parse(fs, args[1:]); c >= 0 {
		return c
	}
	e, err := engine.New(engine.Options{Progress: os.Stderr})
	if err != nil {
		return fail(err)
	}
	switch sub {
	case "build":
		name := "python"
		if fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		img, err := e.Images().Build(ctx, name, image.BuildOptions{Progress: os.Stderr, Locked: *locked, LockfileDir: *lockDir})
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%s %s (%d packages) at %s\n", img.Name, img.Digest, len(img.Packages), img.Root)
		return 0
	case "list":
		imgs, err := e.Images().List()
		if err != nil {
			return fail(err)
		}
		if len(imgs) == 0 {
			fmt.Println("no images built yet; run: moat image build python")
		}
		for _, img := range imgs {
			cur := ""
			if img.Current {
				cur = " (current)"
			}
			fmt.Printf("%-10s %s %s%s\n", img.Name, img.Digest, img.Built.Format("2006-01-02 15:04"), cur)
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "moat image: unknown subcommand %q\n", sub)
	fs.Usage()
	return exitUsage
}
