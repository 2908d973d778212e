package kmsg

import (
	"bytes"
	"log/slog"
	"strconv"
)

// The Boot Error Record Table (BERT) holds the hardware errors of the boot
// before, which the firmware could not hand to the OS then: a fatal error
// that GHES reported panics the kernel (__ghes_panic), so its record is
// printed at the next boot, from BERT, and that is where
// CperHardwareErrorFatal's "[Hardware Error]: event severity: fatal" comes
// from (drivers/acpi/apei/bert.c bert_print_all, cper_estatus_print with
// KERN_INFO HW_ERR). The kernel does not print every record:
//
//   - Since "ACPI: APEI: Better fix to avoid spamming the console with old
//     error logs" (6.0, and the stable kernels it went to) it prints at
//     most 5 records (ACPI_BERT_PRINT_MAX_RECORDS) and none of 1 KiB or
//     more (ACPI_BERT_PRINT_MAX_LEN), then, for the rest,
//     pr_info(HW_ERR "Skipped %d error records\n") under pr_fmt "BERT: ":
//
//     BERT: [Hardware Error]: Skipped 3 error records
//
//   - Before it, "ACPI/APEI: Limit printable size of BERT table data"
//     (3f8dec116210, 5.17 and the stable kernels it went to) printed no
//     record at all where the whole region was 1 KiB or more, only
//     pr_info_once("Max print length exceeded, table data is available
//     at:\n/sys/firmware/acpi/tables/data/BERT"), one record of two lines:
//
//     BERT: Max print length exceeded, table data is available at:
//     /sys/firmware/acpi/tables/data/BERT
//
// A fatal error among the records not printed sets no
// CperHardwareErrorFatal: the monitor logs such a line as a warning, with
// the count where the kernel gives one, so that an operator looks at the
// table itself (/sys/firmware/acpi/tables/data/BERT, root's).
var (
	bertSkipped  = []byte("BERT: [Hardware Error]: Skipped ")
	bertSkipped2 = []byte(" error records")
	bertTooLarge = []byte("BERT: Max print length exceeded, table data is available at:")
)

// parseBERTUnprinted reads the kernel's line about the BERT records it did
// not print: skipped is the count ("Skipped N error records"), or -1 where
// the line gives none (it printed none: "Max print length exceeded"); ok
// false for any other message. It does not allocate.
func parseBERTUnprinted(msg []byte) (skipped int64, ok bool) {
	if !bytes.HasPrefix(msg, bertSkipped[:6]) { // "BERT: ", the cheap test for every record
		return 0, false
	}
	if bytes.HasPrefix(msg, bertTooLarge) {
		return -1, true
	}
	rest, found := bytes.CutPrefix(msg, bertSkipped)
	if !found {
		return 0, false
	}
	digits, found := bytes.CutSuffix(bytes.TrimRight(rest, " \n"), bertSkipped2)
	if !found || len(digits) == 0 || len(digits) > 9 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, _ := strconv.ParseInt(string(digits), 10, 64) // 9 digits at most: no error; the conversion does not escape
	return n, true
}

// bertUnprinted logs a line of the kernel about the BERT records it did
// not print (parseBERTUnprinted), once for each such record read: the
// kernel prints it once a boot, at its start; a restart that reads the
// ring buffer from its start (from_boot_start) logs it again.
func bertUnprinted(log *slog.Logger, skipped int64, msg string) {
	n, args := "any (the table is 1 KiB or more)", []any{"line", msg}
	if skipped >= 0 {
		n, args = strconv.FormatInt(skipped, 10)+" (it prints at most 5, none of 1 KiB or more)", append(args, "records", skipped)
	}
	log.Warn("the kernel did not print "+n+" of the previous boot's hardware error records in the firmware's Boot Error Record Table (BERT): "+
		"a fatal error among them sets no CperHardwareErrorFatal; read them from /sys/firmware/acpi/tables/data/BERT (root only; e.g. with rasdaemon or the vendor's tools)", args...)
}
