// Package tamper holds the mechanics of the tamper conditions, with no
// condition state of its own: the baseline of the protected files (Scan,
// Diff) and the file it is kept in (State), file notifications (Watch), and
// the sealed OS layers: the verity tables the kernel enforces, read over the
// device-mapper ioctl interface (DM), and the root hashes recorded at
// provisioning (ParseRecorded). The checks in package checks turn what it
// finds into NodeTampered and SealedOSTampered.
package tamper
