//go:build linux

package cuda

import "github.com/ebitengine/purego"

// errUnsupportedOS is nil where the backend can load its libraries.
var errUnsupportedOS error

// dlopen opens a shared library (a path or a soname) with RTLD_NOW and
// RTLD_GLOBAL (global) or RTLD_LOCAL.
func dlopen(name string, global bool) (uintptr, error) {
	mode := purego.RTLD_NOW | purego.RTLD_LOCAL
	if global {
		mode = purego.RTLD_NOW | purego.RTLD_GLOBAL
	}
	return purego.Dlopen(name, mode)
}

// dlsym reports whether lib exports name (nil) or why not.
func dlsym(lib uintptr, name string) error {
	_, err := purego.Dlsym(lib, name)
	return err
}

// registerLibFunc binds the function pointer fp to lib's symbol name.
func registerLibFunc(fp any, lib uintptr, name string) { purego.RegisterLibFunc(fp, lib, name) }
