package conformance

// Rule describes one rule of a suite: ID is "<kind>/<name>" and appears in
// brackets at the start of every failure message of the rule.
type Rule struct {
	ID      string
	Summary string
}

// Rules returns every rule of every suite, grouped by kind (engine,
// control, gather, scatter, writer) in the order the suites run them.
func Rules() []Rule {
	var out []Rule
	out = append(out, engineSuite(nil).ruleList()...)
	out = append(out, controlSuite(nil).ruleList()...)
	out = append(out, gathererSuite(nil).ruleList()...)
	out = append(out, scattererSuite(nil).ruleList()...)
	out = append(out, writerSuite(nil).ruleList()...)
	return out
}
