"""Who may do what: rules, the ask gate, policies and their layers, questions, the audit."""
