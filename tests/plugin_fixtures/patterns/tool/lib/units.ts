export const UNITS = ["b", "kb", "mb"]
