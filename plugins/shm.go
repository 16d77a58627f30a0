package plugins

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	pb "github.com/bouncekv/bounce/plugins/internal/proto"
	"github.com/bouncekv/bounce/transfer"
)

// Memory sharing. Every host range bounce registers with a plugin is a
// MAP_SHARED mapping of a memfd (mem.Alloc, mem.NewArena). The host finds
// the mapping in /proc/self/maps, the memfd among its open descriptors
// (matching device and inode), and sends {pid, fd, file offset, inode}. The
// plugin opens /proc/<pid>/fd/<fd> and maps the file at the same virtual
// address with MAP_FIXED_NOREPLACE, so every address means the same bytes in
// both processes and nothing is ever translated.

// shareOf returns where the bytes of the host descriptor d live in this
// process. Memory that is not a shared memfd mapping (a Go heap slice,
// anonymous memory) cannot be shared and is ErrUnsupported.
func shareOf(d transfer.Desc) (*pb.Share, error) {
	if d.Kind != transfer.Host {
		return nil, fmt.Errorf("plugin: share %v: not yet: device memory cannot cross to a plugin (only host memory can be shared): %w", d, transfer.ErrUnsupported)
	}
	if d.Len == 0 || d.Addr+d.Len < d.Addr {
		return nil, fmt.Errorf("plugin: share %v: empty or wrapping range: %w", d, transfer.ErrOutOfBounds)
	}
	m, err := findMapping(d)
	if err != nil {
		return nil, err
	}
	fd, err := findFd(m.dev, m.ino)
	if err != nil {
		return nil, fmt.Errorf("plugin: share %v: %w", d, err)
	}
	return &pb.Share{Pid: int64(os.Getpid()), Fd: int64(fd), Offset: m.off + (d.Addr - m.start), Inode: m.ino, Dev: m.dev}, nil
}

// mapping is one line of /proc/self/maps, possibly merged with the
// following lines of the same file at consecutive offsets.
type mapping struct {
	start, end, off, dev, ino uint64
	shared                    bool
	path                      string
}

func parseMapsLine(line string) (mapping, bool) {
	f := strings.Fields(line)
	if len(f) < 5 {
		return mapping{}, false
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return mapping{}, false
	}
	var m mapping
	var err error
	if m.start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return mapping{}, false
	}
	if m.end, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return mapping{}, false
	}
	m.shared = len(f[1]) == 4 && f[1][3] == 's'
	if m.off, err = strconv.ParseUint(f[2], 16, 64); err != nil {
		return mapping{}, false
	}
	maj, mnr, ok := strings.Cut(f[3], ":")
	if !ok {
		return mapping{}, false
	}
	a, err1 := strconv.ParseUint(maj, 16, 32)
	b, err2 := strconv.ParseUint(mnr, 16, 32)
	if err1 != nil || err2 != nil {
		return mapping{}, false
	}
	m.dev = unix.Mkdev(uint32(a), uint32(b))
	if m.ino, err = strconv.ParseUint(f[4], 10, 64); err != nil {
		return mapping{}, false
	}
	if len(f) > 5 {
		m.path = strings.Join(f[5:], " ")
	}
	return m, true
}

// findMapping returns the shared memfd mapping that holds all of d.
func findMapping(d transfer.Desc) (mapping, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return mapping{}, fmt.Errorf("plugin: share %v: %w", d, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	var cur mapping
	found := false
	for sc.Scan() {
		m, ok := parseMapsLine(sc.Text())
		if !ok {
			continue
		}
		if !found {
			if d.Addr < m.start || d.Addr >= m.end {
				continue
			}
			cur, found = m, true
		} else if m.start == cur.end && m.ino == cur.ino && m.dev == cur.dev && m.shared == cur.shared && m.off == cur.off+(cur.end-cur.start) {
			cur.end = m.end // the same file split in several VMAs
		} else {
			break
		}
		if d.End() <= cur.end {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return mapping{}, fmt.Errorf("plugin: share %v: reading /proc/self/maps: %w", d, err)
	}
	switch {
	case !found:
		return mapping{}, fmt.Errorf("plugin: share %v: address not mapped in this process: %w", d, transfer.ErrNotRegistered)
	case !cur.shared || !strings.HasPrefix(cur.path, "/memfd:"):
		return mapping{}, fmt.Errorf("plugin: share %v: memory is not a shared memfd mapping (got %q); a plugin can only use memory from mem.Alloc or mem.NewArena: %w", d, cur.path, transfer.ErrUnsupported)
	case d.End() > cur.end:
		return mapping{}, fmt.Errorf("plugin: share %v: range runs past its memfd mapping [%#x, %#x): %w", d, cur.start, cur.end, transfer.ErrOutOfBounds)
	}
	return cur, nil
}

// findFd returns an open descriptor of this process for the file (dev, ino).
func findFd(dev, ino uint64) (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1, err
	}
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+e.Name(), &st) != nil {
			continue
		}
		if st.Ino == ino && uint64(st.Dev) == dev {
			return n, nil
		}
	}
	return -1, fmt.Errorf("no open descriptor for memfd inode %d (was its mem.Buffer freed?): %w", ino, transfer.ErrUnsupported)
}

// mapper maps host memfds into the plugin process at the host's addresses,
// page by page with reference counts, so overlapping registrations share
// pages. One mapper serves a whole plugin process.
type mapper struct {
	self int
	page uint64
	mu   sync.Mutex
	// pages maps a page address to the file page mapped there.
	pages map[uint64]*sharedPage
}

type sharedPage struct {
	dev, ino, off uint64
	refs          int
}

func newMapper() *mapper {
	return &mapper{self: os.Getpid(), page: uint64(os.Getpagesize()), pages: map[uint64]*sharedPage{}}
}

// local reports whether s names memory of this very process (an in-process
// plugin, as in tests), which needs no mapping.
func (m *mapper) local(s *pb.Share) bool { return s.GetPid() == int64(m.self) }

// Map makes d, described by s, addressable at d.Addr in this process.
func (m *mapper) Map(d transfer.Desc, s *pb.Share) error {
	if s == nil {
		return fmt.Errorf("plugin: map %v: the host sent no memory share: %w", d, transfer.ErrUnsupported)
	}
	if m.local(s) {
		return nil
	}
	if d.Len == 0 || d.Addr+d.Len < d.Addr || d.End() > ^uint64(0)-m.page {
		return fmt.Errorf("plugin: map %v: empty or wrapping range: %w", d, transfer.ErrOutOfBounds)
	}
	start := d.Addr &^ (m.page - 1)
	end := (d.End() + m.page - 1) &^ (m.page - 1)
	if s.GetOffset() < d.Addr-start || s.GetFd() < 0 || s.GetPid() <= 0 {
		return fmt.Errorf("plugin: map %v: malformed share %v: %w", d, s, transfer.ErrBadMetadata)
	}
	fileStart := s.GetOffset() - (d.Addr - start)
	path := fmt.Sprintf("/proc/%d/fd/%d", s.GetPid(), s.GetFd())
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("plugin: map %v: open host memory %s: %w", d, path, err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("plugin: map %v: stat %s: %w", d, path, err)
	}
	if st.Ino != s.GetInode() || uint64(st.Dev) != s.GetDev() {
		return fmt.Errorf("plugin: map %v: %s is not the memfd the host named (inode %d, want %d): %w", d, path, st.Ino, s.GetInode(), transfer.ErrBadMetadata)
	}
	if uint64(st.Size) < s.GetOffset()+d.Len {
		return fmt.Errorf("plugin: map %v: host memfd is %d bytes, range needs %d: %w", d, st.Size, s.GetOffset()+d.Len, transfer.ErrOutOfBounds)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// Check every page already mapped, then map the missing runs.
	for p := start; p < end; p += m.page {
		if sp, ok := m.pages[p]; ok && (sp.dev != s.GetDev() || sp.ino != s.GetInode() || sp.off != fileStart+(p-start)) {
			return fmt.Errorf("plugin: map %v: page %#x already maps another file here", d, p)
		}
	}
	var mapped [][2]uint64
	undo := func() {
		for _, r := range mapped {
			_ = munmap(r[0], r[1]-r[0])
		}
	}
	for p := start; p < end; {
		if _, ok := m.pages[p]; ok {
			p += m.page
			continue
		}
		q := p
		for q < end {
			if _, ok := m.pages[q]; ok {
				break
			}
			q += m.page
		}
		if err := mmapFixed(int(f.Fd()), fileStart+(p-start), p, q-p); err != nil {
			undo()
			return fmt.Errorf("plugin: map %v: %w", d, err)
		}
		mapped = append(mapped, [2]uint64{p, q})
		p = q
	}
	for p := start; p < end; p += m.page {
		sp, ok := m.pages[p]
		if !ok {
			sp = &sharedPage{dev: s.GetDev(), ino: s.GetInode(), off: fileStart + (p - start)}
			m.pages[p] = sp
		}
		sp.refs++
	}
	return nil
}

// Unmap drops one reference to the pages of d (mapped with s) and unmaps
// the pages nobody uses any more.
func (m *mapper) Unmap(d transfer.Desc, s *pb.Share) {
	if s == nil || m.local(s) {
		return
	}
	start := d.Addr &^ (m.page - 1)
	end := (d.End() + m.page - 1) &^ (m.page - 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	// Pages whose last reference goes are unmapped in runs of consecutive
	// pages: one munmap per run, not per page.
	var runStart, runEnd uint64
	flush := func() {
		if runEnd > runStart {
			_ = munmap(runStart, runEnd-runStart)
		}
		runStart, runEnd = 0, 0
	}
	for p := start; p < end; p += m.page {
		sp, ok := m.pages[p]
		if !ok {
			flush()
			continue
		}
		if sp.refs--; sp.refs != 0 {
			flush()
			continue
		}
		delete(m.pages, p)
		if runEnd != p {
			flush()
			runStart = p
		}
		runEnd = p + m.page
	}
	flush()
}

// mmapFixed maps n bytes of fd at file offset off exactly at addr, failing
// if anything is mapped there already.
func mmapFixed(fd int, off, addr, n uint64) error {
	want := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	got, err := unix.MmapPtr(fd, int64(off), want, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED_NOREPLACE)
	if err == unix.EEXIST {
		return fmt.Errorf("address range [%#x, %#x) is already in use in the plugin process; the host's memory cannot be mapped at the same address (allocate it again and retry): %w", addr, addr+n, transfer.ErrUnsupported)
	}
	if err != nil {
		return fmt.Errorf("mmap %d bytes at %#x: %w", n, addr, err)
	}
	if got != want {
		// A kernel without MAP_FIXED_NOREPLACE treats addr as a hint.
		_ = unix.MunmapPtr(got, uintptr(n))
		return fmt.Errorf("kernel placed the mapping at %p, not %#x (needs Linux ≥ 4.17 for MAP_FIXED_NOREPLACE): %w", got, addr, transfer.ErrUnsupported)
	}
	return nil
}

func munmap(addr, n uint64) error {
	return unix.MunmapPtr(*(*unsafe.Pointer)(unsafe.Pointer(&addr)), uintptr(n))
}
