// Populate the sidebar
//
// This is a script, and not included directly in the page, to control the total size of the book.
// The TOC contains an entry for each page, so if each page includes a copy of the TOC,
// the total size of the page becomes O(n**2).
class MDBookSidebarScrollbox extends HTMLElement {
    constructor() {
        super();
    }
    connectedCallback() {
        this.innerHTML = '<ol class="chapter"><li class="chapter-item expanded affix "><a href="introduction.html">Introduction</a></li><li class="chapter-item expanded affix "><a href="getting-started.html">Getting started</a></li><li class="chapter-item expanded affix "><li class="part-title">Client APIs</li><li class="chapter-item expanded "><a href="http.html">HTTP contract and Chat Completions</a></li><li class="chapter-item expanded "><a href="apis/responses.html">The Responses API (Codex CLI)</a></li><li class="chapter-item expanded "><a href="apis/messages.html">The Anthropic Messages API (Claude Code)</a></li><li class="chapter-item expanded affix "><li class="part-title">Backends</li><li class="chapter-item expanded "><a href="backends/app-server.html">Codex app-server</a></li><li class="chapter-item expanded "><a href="backends/claude-code.html">Claude Code</a></li><li class="chapter-item expanded "><a href="backends/openai.html">OpenAI-compatible upstreams</a></li><li class="chapter-item expanded affix "><li class="part-title">Running it</li><li class="chapter-item expanded "><a href="configuration.html">Configuration reference</a></li><li class="chapter-item expanded "><a href="cli.html">Command line</a></li><li class="chapter-item expanded "><a href="approvals.html">Approvals and the console</a></li><li class="chapter-item expanded "><a href="replicas.html">Replicas</a></li><li class="chapter-item expanded "><a href="operations.html">Operations: usage accounting and Docker</a></li><li class="chapter-item expanded "><a href="security.html">Security model</a></li><li class="chapter-item expanded affix "><li class="part-title">Internals</li><li class="chapter-item expanded "><a href="canonical-json.html">Canonical JSON</a></li><li class="chapter-item expanded "><a href="testing.html">Tests: fuzzing, crashes and floods</a></li><li class="chapter-item expanded "><a href="benchmarks.html">Benchmarks</a></li></ol>';
        // Set the current, active page, and reveal it if it's hidden
        let current_page = document.location.href.toString().split("#")[0].split("?")[0];
        if (current_page.endsWith("/")) {
            current_page += "index.html";
        }
        var links = Array.prototype.slice.call(this.querySelectorAll("a"));
        var l = links.length;
        for (var i = 0; i < l; ++i) {
            var link = links[i];
            var href = link.getAttribute("href");
            if (href && !href.startsWith("#") && !/^(?:[a-z+]+:)?\/\//.test(href)) {
                link.href = path_to_root + href;
            }
            // The "index" page is supposed to alias the first chapter in the book.
            if (link.href === current_page || (i === 0 && path_to_root === "" && current_page.endsWith("/index.html"))) {
                link.classList.add("active");
                var parent = link.parentElement;
                if (parent && parent.classList.contains("chapter-item")) {
                    parent.classList.add("expanded");
                }
                while (parent) {
                    if (parent.tagName === "LI" && parent.previousElementSibling) {
                        if (parent.previousElementSibling.classList.contains("chapter-item")) {
                            parent.previousElementSibling.classList.add("expanded");
                        }
                    }
                    parent = parent.parentElement;
                }
            }
        }
        // Track and set sidebar scroll position
        this.addEventListener('click', function(e) {
            if (e.target.tagName === 'A') {
                sessionStorage.setItem('sidebar-scroll', this.scrollTop);
            }
        }, { passive: true });
        var sidebarScrollTop = sessionStorage.getItem('sidebar-scroll');
        sessionStorage.removeItem('sidebar-scroll');
        if (sidebarScrollTop) {
            // preserve sidebar scroll position when navigating via links within sidebar
            this.scrollTop = sidebarScrollTop;
        } else {
            // scroll sidebar to current active section when navigating via "next/previous chapter" buttons
            var activeSection = document.querySelector('#sidebar .active');
            if (activeSection) {
                activeSection.scrollIntoView({ block: 'center' });
            }
        }
        // Toggle buttons
        var sidebarAnchorToggles = document.querySelectorAll('#sidebar a.toggle');
        function toggleSection(ev) {
            ev.currentTarget.parentElement.classList.toggle('expanded');
        }
        Array.from(sidebarAnchorToggles).forEach(function (el) {
            el.addEventListener('click', toggleSection);
        });
    }
}
window.customElements.define("mdbook-sidebar-scrollbox", MDBookSidebarScrollbox);
