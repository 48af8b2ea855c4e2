// Command modcheck fails if a module directory cannot be published: if the go
// command would refuse to make its module zip, no user can download that
// version. It applies golang.org/x/mod/zip's checks, the go command's own, to
// each directory named on the command line: file names that Windows reserves
// (nul, con, aux...), names that collide when case is folded, and the size
// limits of a module zip.
//
//	go run ./modcheck DIR...
package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: modcheck DIR...")
		os.Exit(2)
	}
	status := 0
	for _, dir := range os.Args[1:] {
		if err := check(dir); err != nil {
			fmt.Fprintf(os.Stderr, "modcheck: %s: %v\n", dir, err)
			status = 1
		}
	}
	os.Exit(status)
}

// check reports every file of the module in dir that a module zip cannot hold.
func check(dir string) error {
	files, err := zip.CheckDir(dir)
	if err == nil {
		return nil
	}
	var errs []error
	for _, f := range files.Invalid {
		errs = append(errs, fmt.Errorf("%s: %w", f.Path, f.Err))
	}
	if files.SizeError != nil {
		errs = append(errs, files.SizeError)
	}
	if len(errs) == 0 {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
