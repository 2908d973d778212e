package main

// stopProfile ends the CPU profile of a binary built with -tags profile
// (profile.go); a no-op otherwise.
var stopProfile = func() {}
