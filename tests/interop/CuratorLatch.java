// Interop peer for zkgate integration tests: drives an Apache Curator LeaderLatch
// through a line protocol on stdin/stdout.
//
//   java -cp "$(tests/interop/classpath.sh)" CuratorLatch <connectString> <latchPath> <id>
//
// stdout (one line each, flushed):
//   READY                  once the client is connected
//   STARTED                reply to "start" (the latch joins the election)
//   LEADER | NOT_LEADER    reply to "await <millis>"
//   CLOSED                 reply to "close" (the latch leaves the election)
//   ERROR <message>        any exception while handling a command
// stdin: "start", "await <millis>", "close", "quit" (EOF behaves like quit).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.retry.ExponentialBackoffRetry;

public class CuratorLatch {
    private static PrintStream out;

    private static void say(String line) {
        out.println(line);
        out.flush();
    }

    public static void main(String[] args) throws Exception {
        out = new PrintStream(System.out, true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        if (args.length != 3) {
            say("ERROR usage: CuratorLatch <connectString> <latchPath> <id>");
            System.exit(1);
        }
        CuratorFramework client = CuratorFrameworkFactory.builder()
                .connectString(args[0])
                .sessionTimeoutMs(10_000)
                .connectionTimeoutMs(10_000)
                .retryPolicy(new ExponentialBackoffRetry(200, 5))
                .build();
        client.start();
        if (!client.blockUntilConnected(30, TimeUnit.SECONDS)) {
            say("ERROR could not connect to " + args[0]);
            System.exit(1);
        }
        LeaderLatch latch = new LeaderLatch(client, args[1], args[2]);
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] words = line.trim().split("\\s+");
            try {
                switch (words[0]) {
                    case "start":
                        latch.start();
                        say("STARTED");
                        break;
                    case "await":
                        say(latch.await(Long.parseLong(words[1]), TimeUnit.MILLISECONDS) ? "LEADER" : "NOT_LEADER");
                        break;
                    case "close":
                        latch.close();
                        say("CLOSED");
                        break;
                    case "quit":
                        client.close();
                        return;
                    default:
                        say("ERROR unknown command: " + words[0]);
                }
            } catch (Exception e) {
                say("ERROR " + String.valueOf(e).replace('\n', ' '));
            }
        }
        client.close();
    }
}
