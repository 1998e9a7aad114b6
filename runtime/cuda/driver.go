package cuda

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// DevPtr is a device address (CUdeviceptr).
type DevPtr uint64

// driverAPI holds the driver entry points (CUDA ≥ 11 names; the _v2
// symbols are the 64-bit versions the cuda.h macros select).
type driverAPI struct {
	path               string
	init               func(flags uint32) int32
	driverGetVersion   func(v *int32) int32
	deviceGetCount     func(n *int32) int32
	deviceGet          func(d *int32, ordinal int32) int32
	deviceGetAttribute func(v *int32, attr int32, dev int32) int32
	deviceGetName      func(buf *byte, n int32, dev int32) int32
	deviceTotalMem     func(b *uint64, dev int32) int32
	primaryCtxRetain   func(ctx *uintptr, dev int32) int32
	primaryCtxRelease  func(dev int32) int32
	ctxSetCurrent      func(ctx uintptr) int32
	ctxSynchronize     func() int32
	memAlloc           func(p *DevPtr, size uint64) int32
	memFree            func(p DevPtr) int32
	memcpyHtoD         func(dst DevPtr, src unsafe.Pointer, size uint64) int32
	memcpyDtoH         func(dst unsafe.Pointer, src DevPtr, size uint64) int32
	memcpyDtoD         func(dst, src DevPtr, size uint64) int32
	memsetD8           func(dst DevPtr, v uint8, n uint64) int32
	moduleLoadData     func(m *uintptr, image *byte) int32
	moduleUnload       func(m uintptr) int32
	moduleGetFunction  func(f *uintptr, m uintptr, name *byte) int32
	launchKernel       func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, stream uintptr, params unsafe.Pointer, extra unsafe.Pointer) int32
	funcSetAttribute   func(f uintptr, attr int32, v int32) int32
	getErrorString     func(res int32, s **byte) int32
}

var (
	driverOnce sync.Once
	driverLib  *driverAPI
	driverErr  error
)

// loadDriver opens libcuda.so.1 once. Errors wrap ErrNoDriver.
func loadDriver() (*driverAPI, error) {
	driverOnce.Do(func() {
		lib, path, err := dlopenFirst(ErrNoDriver, []string{"libcuda.so.1"})
		if err != nil && errUnsupportedOS != nil {
			driverErr = err
			return
		}
		if err != nil {
			driverErr = fmt.Errorf("%w (the NVIDIA driver installs libcuda.so.1; is this a GPU machine?)", err)
			return
		}
		d := &driverAPI{path: path}
		driverErr = bind(lib, path, map[string]any{
			"cuInit":                       &d.init,
			"cuDriverGetVersion":           &d.driverGetVersion,
			"cuDeviceGetCount":             &d.deviceGetCount,
			"cuDeviceGet":                  &d.deviceGet,
			"cuDeviceGetAttribute":         &d.deviceGetAttribute,
			"cuDeviceGetName":              &d.deviceGetName,
			"cuDeviceTotalMem_v2":          &d.deviceTotalMem,
			"cuDevicePrimaryCtxRetain":     &d.primaryCtxRetain,
			"cuDevicePrimaryCtxRelease_v2": &d.primaryCtxRelease,
			"cuCtxSetCurrent":              &d.ctxSetCurrent,
			"cuCtxSynchronize":             &d.ctxSynchronize,
			"cuMemAlloc_v2":                &d.memAlloc,
			"cuMemFree_v2":                 &d.memFree,
			"cuMemcpyHtoD_v2":              &d.memcpyHtoD,
			"cuMemcpyDtoH_v2":              &d.memcpyDtoH,
			"cuMemcpyDtoD_v2":              &d.memcpyDtoD,
			"cuMemsetD8_v2":                &d.memsetD8,
			"cuModuleLoadData":             &d.moduleLoadData,
			"cuModuleUnload":               &d.moduleUnload,
			"cuModuleGetFunction":          &d.moduleGetFunction,
			"cuLaunchKernel":               &d.launchKernel,
			"cuFuncSetAttribute":           &d.funcSetAttribute,
			"cuGetErrorString":             &d.getErrorString,
		})
		if driverErr == nil {
			driverLib = d
		}
	})
	return driverLib, driverErr
}

// cuError is a failed driver call.
type cuError struct {
	call string
	code int32
	msg  string
}

func (e *cuError) Error() string {
	return fmt.Sprintf("cuda: %s: %s (CUresult %d)", e.call, e.msg, e.code)
}

func (d *driverAPI) check(call string, r int32) error {
	if r == 0 {
		return nil
	}
	msg := "unknown error"
	var s *byte
	if d.getErrorString(r, &s) == 0 && s != nil {
		msg = goString(s)
	}
	return &cuError{call, r, msg}
}

// goString copies a NUL-terminated C string.
func goString(p *byte) string {
	var b []byte
	for q := unsafe.Pointer(p); *(*byte)(q) != 0; q = unsafe.Add(q, 1) {
		b = append(b, *(*byte)(q))
	}
	return string(b)
}

// Device is one CUDA device with its primary context current on a
// dedicated OS thread. Every method that touches the driver runs there;
// Device is safe for concurrent use (calls are serialized).
type Device struct {
	drv *driverAPI
	// Ordinal, Name, CC (major·10+minor), SMs, TotalMem (bytes) and
	// DriverVersion (e.g. 12040) describe the device.
	Ordinal       int
	Name          string
	CC            int
	SMs           int
	TotalMem      uint64
	DriverVersion int

	calls    chan func()
	released chan error // the context release's result, once
	dev      int32
	ctx      uintptr
	closed   bool
	mu       sync.Mutex
}

// OpenDevice loads the driver, initializes it and retains the primary
// context of device ordinal on a new locked OS thread. Errors wrap
// ErrNoDriver (library missing), ErrNoDevice (no device or ordinal out of
// range) or a driver error.
func OpenDevice(ordinal int) (*Device, error) {
	drv, err := loadDriver()
	if err != nil {
		return nil, err
	}
	d := &Device{drv: drv, Ordinal: ordinal, calls: make(chan func()), released: make(chan error, 1)}
	ready := make(chan error)
	go d.serve(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return d, nil
}

// serve is the driver thread: it locks itself to an OS thread, sets the
// context up, then runs calls until the channel is closed.
func (d *Device) serve(ready chan<- error) {
	runtime.LockOSThread()
	drv := d.drv
	setup := func() error {
		if err := drv.check("cuInit", drv.init(0)); err != nil {
			return fmt.Errorf("%w: %v", ErrNoDevice, err)
		}
		var v, n int32
		if err := drv.check("cuDriverGetVersion", drv.driverGetVersion(&v)); err != nil {
			return err
		}
		d.DriverVersion = int(v)
		if err := drv.check("cuDeviceGetCount", drv.deviceGetCount(&n)); err != nil {
			return err
		}
		if d.Ordinal < 0 || d.Ordinal >= int(n) {
			return fmt.Errorf("%w: device %d requested, the driver (%s) reports %d", ErrNoDevice, d.Ordinal, drv.path, n)
		}
		if err := drv.check("cuDeviceGet", drv.deviceGet(&d.dev, int32(d.Ordinal))); err != nil {
			return err
		}
		var ma, mi, sms int32
		for _, a := range []struct {
			v    *int32
			attr int32
			name string
		}{
			{&ma, 75, "COMPUTE_CAPABILITY_MAJOR"},
			{&mi, 76, "COMPUTE_CAPABILITY_MINOR"},
			{&sms, 16, "MULTIPROCESSOR_COUNT"},
		} {
			if err := drv.check("cuDeviceGetAttribute("+a.name+")", drv.deviceGetAttribute(a.v, a.attr, d.dev)); err != nil {
				return err
			}
		}
		d.CC, d.SMs = int(ma*10+mi), int(sms)
		name := make([]byte, 256)
		if err := drv.check("cuDeviceGetName", drv.deviceGetName(&name[0], int32(len(name)-1), d.dev)); err != nil {
			return err
		}
		d.Name = goString(&name[0])
		if err := drv.check("cuDeviceTotalMem", drv.deviceTotalMem(&d.TotalMem, d.dev)); err != nil {
			return err
		}
		if err := drv.check("cuDevicePrimaryCtxRetain", drv.primaryCtxRetain(&d.ctx, d.dev)); err != nil {
			return err
		}
		if err := drv.check("cuCtxSetCurrent", drv.ctxSetCurrent(d.ctx)); err != nil {
			drv.primaryCtxRelease(d.dev) // the setup error is the one reported
			return err
		}
		return nil
	}
	err := setup()
	ready <- err
	if err != nil {
		runtime.UnlockOSThread()
		return
	}
	for f := range d.calls {
		f()
	}
	d.released <- drv.check("cuDevicePrimaryCtxRelease", drv.primaryCtxRelease(d.dev))
	runtime.UnlockOSThread()
}

// Do runs f on the driver thread and returns its error.
func (d *Device) Do(f func() error) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("cuda: device %d is closed", d.Ordinal)
	}
	done := make(chan error, 1)
	d.calls <- func() { done <- f() }
	d.mu.Unlock()
	return <-done
}

// Close releases the primary context and stops the driver thread,
// returning cuDevicePrimaryCtxRelease's error (nil on later calls).
// Memory and modules must be freed first.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	close(d.calls)
	d.mu.Unlock()
	return <-d.released
}

// Alloc returns n bytes of device memory (n ≥ 1), zeroed.
func (d *Device) Alloc(n int64) (DevPtr, error) {
	var p DevPtr
	err := d.Do(func() error {
		if err := d.drv.check(fmt.Sprintf("cuMemAlloc(%d bytes)", n), d.drv.memAlloc(&p, uint64(max(n, 1)))); err != nil {
			return err
		}
		return d.drv.check("cuMemsetD8", d.drv.memsetD8(p, 0, uint64(max(n, 1))))
	})
	return p, err
}

// Free releases memory from Alloc (0 is ignored).
func (d *Device) Free(p DevPtr) error {
	if p == 0 {
		return nil
	}
	return d.Do(func() error { return d.drv.check("cuMemFree", d.drv.memFree(p)) })
}

// Upload copies the bytes of src (a slice of a fixed-size element type)
// to dst.
func Upload[T any](d *Device, dst DevPtr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	n := uint64(len(src)) * uint64(unsafe.Sizeof(src[0]))
	return d.Do(func() error {
		return d.drv.check("cuMemcpyHtoD", d.drv.memcpyHtoD(dst, unsafe.Pointer(&src[0]), n))
	})
}

// Download copies len(dst) elements from src into dst.
func Download[T any](d *Device, dst []T, src DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	n := uint64(len(dst)) * uint64(unsafe.Sizeof(dst[0]))
	return d.Do(func() error {
		return d.drv.check("cuMemcpyDtoH", d.drv.memcpyDtoH(unsafe.Pointer(&dst[0]), src, n))
	})
}

// CopyDtoD copies n bytes between device buffers (asynchronous with
// respect to the host on the null stream; Sync waits).
func (d *Device) CopyDtoD(dst, src DevPtr, n int64) error {
	return d.Do(func() error { return d.drv.check("cuMemcpyDtoD", d.drv.memcpyDtoD(dst, src, uint64(n))) })
}

// Memset sets n bytes at p to v.
func (d *Device) Memset(p DevPtr, v byte, n int64) error {
	return d.Do(func() error { return d.drv.check("cuMemsetD8", d.drv.memsetD8(p, v, uint64(n))) })
}

// Sync waits for all queued work (cuCtxSynchronize); kernel faults are
// reported here.
func (d *Device) Sync() error {
	return d.Do(func() error { return d.drv.check("cuCtxSynchronize", d.drv.ctxSynchronize()) })
}

// Module is a loaded PTX or CUBIN module.
type Module struct {
	d   *Device
	mod uintptr
	fns map[string]uintptr
}

// LoadModule JIT-loads PTX text (cuModuleLoadData) and resolves the named
// kernels. Errors name the missing kernel.
func (d *Device) LoadModule(ptx string, kernels []string) (*Module, error) {
	return d.LoadImage(&Image{Target: Target{}, Data: []byte(ptx), Entries: kernels})
}

// LoadImage loads a compiled image (cuModuleLoadData: PTX is JIT-compiled
// by the driver, CUBIN taken as is) and resolves img.Entries. Errors: the
// driver's (a *cuError: CUDA_ERROR_UNSUPPORTED_PTX_VERSION when the PTX is
// newer than the driver, CUDA_ERROR_NO_BINARY_FOR_GPU when a CUBIN is for
// another architecture), a missing kernel named.
func (d *Device) LoadImage(img *Image) (*Module, error) {
	data := img.Data
	if !img.Target.Cubin {
		data = append(append([]byte(nil), data...), 0) // PTX is a C string
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("cuda: empty %s image", img.Target.kind())
	}
	m := &Module{d: d, fns: map[string]uintptr{}}
	err := d.Do(func() error {
		if err := d.drv.check("cuModuleLoadData", d.drv.moduleLoadData(&m.mod, &data[0])); err != nil {
			return err
		}
		for _, k := range img.Entries {
			var f uintptr
			nm := append([]byte(k), 0)
			if err := d.drv.check("cuModuleGetFunction("+k+")", d.drv.moduleGetFunction(&f, m.mod, &nm[0])); err != nil {
				if uerr := d.drv.check("cuModuleUnload", d.drv.moduleUnload(m.mod)); uerr != nil {
					return fmt.Errorf("%w (and unloading the module: %v)", err, uerr)
				}
				return err
			}
			m.fns[k] = f
		}
		return nil
	})
	runtime.KeepAlive(data)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Unload releases the module.
func (m *Module) Unload() error {
	return m.d.Do(func() error { return m.d.drv.check("cuModuleUnload", m.d.drv.moduleUnload(m.mod)) })
}

// Dim is a launch grid or block size.
type Dim struct{ X, Y, Z int }

// Launch queues kernel name with grid, block, dynamic shared memory
// (bytes) and arguments on the null stream. Arguments are DevPtr, int32,
// uint32, float32, int64 or uint64 values, passed by value to the kernel
// in order. Errors: unknown kernel, a bad argument type, a launch error.
func (m *Module) Launch(name string, grid, block Dim, shmem int, args ...any) error {
	return m.launch(false, name, grid, block, shmem, args...)
}

// launch is Launch; direct means the caller already runs on the driver
// thread (inside Kernels.Batch).
func (m *Module) launch(direct bool, name string, grid, block Dim, shmem int, args ...any) error {
	f, ok := m.fns[name]
	if !ok {
		return fmt.Errorf("cuda: kernel %q not loaded", name)
	}
	// One 8-byte slot per argument, and a pointer to each slot.
	vals := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case DevPtr:
			vals[i] = uint64(v)
		case int32:
			*(*int32)(unsafe.Pointer(&vals[i])) = v
		case uint32:
			*(*uint32)(unsafe.Pointer(&vals[i])) = v
		case float32:
			*(*float32)(unsafe.Pointer(&vals[i])) = v
		case int64:
			*(*int64)(unsafe.Pointer(&vals[i])) = v
		case uint64:
			vals[i] = v
		case int:
			if v < math.MinInt32 || v > math.MaxInt32 {
				return fmt.Errorf("cuda: kernel %s: argument %d is %d, outside the kernel's int (32-bit) range", name, i, v)
			}
			*(*int32)(unsafe.Pointer(&vals[i])) = int32(v)
		default:
			return fmt.Errorf("cuda: kernel %s: argument %d has type %T, want DevPtr, int32, uint32, float32, int64, uint64 or int", name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&vals[i])
	}
	var pin runtime.Pinner
	if len(args) > 0 {
		pin.Pin(&vals[0])
		pin.Pin(&ptrs[0])
	}
	defer pin.Unpin()
	if err := checkLaunchDims(name, grid, block, shmem); err != nil {
		return err
	}
	var pp unsafe.Pointer
	if len(ptrs) > 0 {
		pp = unsafe.Pointer(&ptrs[0])
	}
	launch := func() error {
		r := m.d.drv.launchKernel(f, uint32(grid.X), uint32(grid.Y), uint32(grid.Z), uint32(block.X), uint32(block.Y), uint32(block.Z), uint32(shmem), 0, pp, nil)
		if err := m.d.drv.check("cuLaunchKernel("+name+")", r); err != nil {
			return fmt.Errorf("%w (grid %v, block %v)", err, grid, block)
		}
		runtime.KeepAlive(vals)
		runtime.KeepAlive(ptrs)
		return nil
	}
	if direct {
		return launch()
	}
	return m.d.Do(launch)
}

// CUDA's launch limits: grid.x ≤ 2³¹−1, grid.y and grid.z ≤ 65535,
// block.x·block.y·block.z ≤ 1024.
const (
	maxGridX  = math.MaxInt32
	maxGridYZ = 65535
	maxBlock  = 1024
)

// checkLaunchDims rejects a launch the driver would refuse, naming the
// kernel and the dimension: every dimension ≥ 1, grid.x ≤ 2³¹−1, grid.y
// and grid.z ≤ 65535, at most 1024 threads, shared memory ≥ 0.
func checkLaunchDims(name string, grid, block Dim, shmem int) error {
	for _, g := range []int{grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z} {
		if g < 1 {
			return fmt.Errorf("cuda: kernel %s: launch grid %v block %v has a dimension < 1", name, grid, block)
		}
	}
	if grid.X > maxGridX || grid.Y > maxGridYZ || grid.Z > maxGridYZ {
		return fmt.Errorf("cuda: kernel %s: launch grid %v exceeds CUDA's limits (x ≤ %d, y and z ≤ %d)", name, grid, maxGridX, maxGridYZ)
	}
	if block.X*block.Y*block.Z > maxBlock || shmem < 0 {
		return fmt.Errorf("cuda: kernel %s: block %v (%d threads, at most %d) or shared memory %d bytes out of range", name, block, block.X*block.Y*block.Z, maxBlock, shmem)
	}
	return nil
}

// SetMaxDynamicShared allows kernel name up to n bytes of dynamic shared
// memory (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES).
func (m *Module) SetMaxDynamicShared(name string, n int) error {
	f, ok := m.fns[name]
	if !ok {
		return fmt.Errorf("cuda: kernel %q not loaded", name)
	}
	return m.d.Do(func() error { return m.d.drv.check("cuFuncSetAttribute", m.d.drv.funcSetAttribute(f, 8, int32(n))) })
}
