package gpucopy

// WithFullTables returns s never building compact piece tables.
func WithFullTables(s Settings) Settings {
	s.fullTables = true
	return s
}
