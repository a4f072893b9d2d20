package imagebuild

// DELETE AT MERGE: this file stands in for imagebuild/imagefile.go of
// branch wt-decl (the declarative image file reader), so that the CLI's
// dispatch compiles on branch wt-build. It is not a stub of behaviour
// anyone relies on: it refuses every file.

import "fmt"

// ReadImageFile reads a declarative image file; see wt-decl.
func ReadImageFile(path string, args map[string]string) (*Plan, error) {
	return nil, fmt.Errorf("read image file %s: declarative image files arrive with branch wt-decl", path)
}
