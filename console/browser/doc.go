// Package browser holds the console's tests in headless Chromium. It is a
// module of its own, so that chromedp stays out of the core module's
// graph; it has no code to import, only tests that drive the console.
package browser
