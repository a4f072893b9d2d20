package main

// moat image build, list, inspect, rm and gc: the root images (package
// image, through the engine's store); image_store.go has all but build.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
)

func cmdImage(args []string) int {
	const usage = "Usage:\n" +
		"  moat image build [--locked] [NAME]   build an image (default python) from Debian packages\n" +
		"  moat image build NAME -f FILE [--context DIR] [--build-arg K=V]... [--locked] [--lockfile FILE]\n" +
		"                  [--ca-file PEM] [--allow-address IP]...\n" +
		"                                       build NAME from a Dockerfile (FROM an image Moat has; RUN steps\n" +
		"                                       run in native sandboxes with no network) or a NAME.yaml image file\n" +
		"  moat image import NAME SOURCE        import an image; SOURCE is docker-archive:FILE, oci-archive:FILE,\n" +
		"                                       oci:DIR[:TAG] or rootfs:FILE.tar[.gz|.zst]\n" +
		"  moat image list                      list stored builds: name, digest, size, created, current\n" +
		"  moat image inspect NAME              print the current build of NAME as JSON\n" +
		"  moat image rm [--force] NAME         remove every build of NAME and its microVM disks (refused while\n" +
		"                                       a sandbox uses one; the default image python needs --force)\n" +
		"  moat image gc                        remove builds no name points to and no sandbox uses, and the\n" +
		"                                       microVM disks of images no longer stored\n\nFlags:\n"
	fs := newFlags("image", usage)
	locked := fs.Bool("locked", false, "fail if the resolved package versions differ from the lockfile")
	force := fs.Bool("force", false, "rm: remove the default image too")
	lockDir := fs.String("lockfile-dir", "", "`DIR` holding NAME.lock to record versions in (e.g. images/ in a checkout)")
	maxBytes := fs.Int64("max-bytes", image.DefaultImportMaxBytes, "import: refuse an image that extracts to more than `N` bytes")
	maxFiles := fs.Int64("max-files", image.DefaultImportMaxFiles, "import: refuse an image with more than `N` files")
	file := fs.String("f", "", "build: the build `FILE` (a Dockerfile, or a declarative NAME.yaml)")
	contextDir := fs.String("context", "", "build -f: the `DIR` COPY sources are relative to (default: the file's directory)")
	lockfile := fs.String("lockfile", "", "build -f: the lockfile `FILE` to write (or, with --locked, to match); default FILE.lock beside the build file")
	caFile := fs.String("ca-file", "", "build -f: a PEM `FILE` of CA certificates that RUN steps with network trust instead of the image's (a TLS-intercepting proxy, e.g. /etc/ssl/certs/ca-certificates.crt)")
	var allowAddrs []string
	fs.Func("allow-address", "build -f: grant a reserved IP `ADDRESS` or prefix to the indexes RUN steps may reach (as a manifest's network.allow_addresses; repeatable)", func(s string) error {
		if _, err := netip.ParsePrefix(s); err != nil {
			if _, err := netip.ParseAddr(s); err != nil {
				return fmt.Errorf("%q is not an IP address or prefix (e.g. 10.0.0.5 or 10.0.0.0/24)", s)
			}
		}
		allowAddrs = append(allowAddrs, s)
		return nil
	})
	bargs := buildArgs{}
	fs.Var(bargs, "build-arg", "build -f: set a Dockerfile ARG, `NAME=value` (repeatable)")
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
		if *file != "" {
			if fs.NArg() != 1 {
				return fail(usageError{fmt.Errorf("image build -f %s: name the image to build, e.g. `moat image build myapp -f %s`", *file, *file)})
			}
			ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
			defer stop()
			return imageBuildFile(ctx, e, fs.Arg(0), buildFileOptions{file: *file, context: *contextDir, args: bargs, locked: *locked, lockfile: *lockfile, allowAddresses: allowAddrs, caFile: *caFile})
		}
		if *contextDir != "" || len(bargs) > 0 || *lockfile != "" || *caFile != "" || len(allowAddrs) > 0 {
			return fail(usageError{fmt.Errorf("image build: --context, --build-arg, --lockfile, --ca-file and --allow-address go with -f FILE")})
		}
		name := "python"
		if fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		img, err := e.BuildImage(ctx, name, image.BuildOptions{Progress: os.Stderr, Locked: *locked, LockfileDir: *lockDir})
		var mismatch *image.LockMismatchError
		if errors.As(err, &mismatch) {
			// The archive no longer gives what was reviewed: a
			// verdict, like diff's, not Moat failing.
			fail(err)
			return exitDiffers
		}
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%s %s (%d packages) at %s\n", img.Name, img.Digest, len(img.Packages), img.Root)
		return 0
	case "import":
		if fs.NArg() != 2 {
			return fail(usageError{fmt.Errorf("image import: want NAME SOURCE, got %d arguments; e.g. `moat image import mypy rootfs:py.tar`", fs.NArg())})
		}
		src, err := image.ParseSource(fs.Arg(1))
		if err != nil {
			return fail(usageError{err})
		}
		// The library reads 0 as "the default cap"; on the command line a
		// non-positive cap is a mistake (or a hope for "no cap", which
		// there is not), so it is refused rather than quietly replaced.
		if *maxBytes <= 0 {
			return fail(usageError{fmt.Errorf("image import --max-bytes %d: must be a positive number of bytes (default %d, 8 GiB); there is no unlimited import", *maxBytes, image.DefaultImportMaxBytes)})
		}
		if *maxFiles <= 0 {
			return fail(usageError{fmt.Errorf("image import --max-files %d: must be a positive number of files (default %d); there is no unlimited import", *maxFiles, image.DefaultImportMaxFiles)})
		}
		ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		img, err := e.Images().Import(ctx, fs.Arg(0), src, image.ImportOptions{Progress: os.Stderr, Terminal: isTerminal(os.Stderr), MaxBytes: *maxBytes, MaxFiles: *maxFiles})
		if errors.Is(err, image.ErrBadImage) {
			return fail(usageError{err})
		}
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%s %s (from %s %s) at %s\n", img.Name, img.Digest, img.Source, img.SourceDigest, img.Root)
		return 0
	case "list":
		return imageList(e.Images())
	case "inspect", "rm":
		if fs.NArg() != 1 {
			fmt.Fprintf(os.Stderr, "moat image %s: name one image (stored: %s)\n", sub, strings.Join(e.Images().Names(), ", "))
			return exitUsage
		}
		if sub == "inspect" {
			return imageInspect(e.Images(), fs.Arg(0), *lockDir)
		}
		return imageRemove(e.Images(), e.Home(), fs.Arg(0), *force)
	case "gc":
		return imageGC(e.Images(), e.Home())
	}
	fmt.Fprintf(os.Stderr, "moat image: unknown subcommand %q\n", sub)
	fs.Usage()
	return exitUsage
}
