package benchreport

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("benchreport: encode report: %w", err)
	}
	return nil
}

// ReadJSON decodes a report written by WriteJSON; a report of another
// schema version is an error.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("benchreport: decode report: %w", err)
	}
	if r.Schema != Schema {
		return nil, fmt.Errorf("benchreport: report schema %d, this build reads %d", r.Schema, Schema)
	}
	return &r, nil
}

// SaveJSON writes r to path (created or truncated).
func SaveJSON(path string, r *Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("benchreport: %w", err)
	}
	if err := WriteJSON(f, r); err != nil {
		f.Close()
		return fmt.Errorf("benchreport: write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("benchreport: write %s: %w", path, err)
	}
	return nil
}

// LoadJSON reads a report from path.
func LoadJSON(path string) (*Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("benchreport: %w", err)
	}
	defer f.Close()
	r, err := ReadJSON(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}
