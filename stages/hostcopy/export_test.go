package hostcopy

// SetBeforeCopy installs a hook a worker runs before each copy. Tests set it
// before the first Submit.
func SetBeforeCopy(e *Engine, f func()) { e.beforeCopy = f }
