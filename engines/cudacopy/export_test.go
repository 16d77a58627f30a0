package cudacopy

// OpenMappings returns how many peer allocations this engine has mapped
// through CUDA IPC (for tests).
func (e *Engine) OpenMappings() int {
	e.fab.mu.Lock()
	defer e.fab.mu.Unlock()
	return len(e.opened)
}
